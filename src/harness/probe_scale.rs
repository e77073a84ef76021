//! The probe engine at scale: many targets' cycles at once in one probe process, the
//! way `serve` runs them ([`Probe::run`]), against reference services in the same
//! process on loopback, each target with its own test prefix and pool.
//!
//! It reports the scheduler's lateness (`lockprobe_probe_schedule_lateness_seconds`,
//! with exact percentiles), the cycles' start delay (`..._cycle_start_delay_seconds`:
//! firing time to the cycle running, which the scheduler's own thread cannot hide), the process CPU time per cycle, and the resident memory per
//! concurrent cycle (peak RSS over the RSS before the first cycle, divided by the most
//! cycles that overlapped). CPU and memory are the whole process's: probe, services and
//! store together. `examples/probe_scale.rs` runs it (figures in BENCHMARKS.md);
//! `tests/probe_scale.rs` runs a small one in the suite. No command of its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::measure;
use crate::clock::{Clock, SystemClock};
use crate::percentiles::Summary;
use crate::probe::checks::observer::Observer;
use crate::probe::checks::report::{Assertion, CycleReport, CycleResult};
use crate::probe::checks::settings::{ProbeSettings, RESOURCES_PER_CYCLE};
use crate::probe::checks::state::StateFile;
use crate::probe::engine::runtime::{Probe, DEFAULT_MAX_CONCURRENT_CYCLES};
use crate::probe::engine::scheduler::{parse_schedule, TargetSchedule};
use crate::service::{self, ServiceConfig};
use crate::store::memory::{MemoryStore, MemoryStoreConfig};
use crate::store::LocationStore;

/// How many targets, services and cycles.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Targets, each with its own schedule, test prefix and pool.
    pub targets: usize,
    /// Reference services (each two instances on loopback over its own store); targets
    /// are spread over them.
    pub services: usize,
    /// Cycles judged per target; the run stops once every target has finished these.
    pub rounds: usize,
    /// Every target's schedule (cron, seconds first).
    pub schedule: String,
    /// Up to this much random delay after each firing.
    pub jitter: Duration,
    /// The services' cache TTL (one tier).
    pub cache_ttl: Duration,
    /// The memory stores' replica lag, declared by the services.
    pub replication_bound: Duration,
    /// The probe's buffer past the declared convergence delay.
    pub buffer: Duration,
    /// How often the probe polls route views while measuring convergence.
    pub poll_interval: Duration,
    /// The probe process's cap on cycles running at once (`max_concurrent_cycles`).
    pub max_concurrent_cycles: usize,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        Self {
            targets: 1000,
            services: 4,
            rounds: 2,
            schedule: "*/10 * * * * *".into(),
            jitter: Duration::from_secs(2),
            cache_ttl: Duration::from_secs(1),
            replication_bound: Duration::from_millis(500),
            // Seconds, not the demo's 500 ms: a thousand cycles share two cores, and a
            // route poll that waits its turn must not read as a convergence violation.
            buffer: Duration::from_secs(2),
            poll_interval: Duration::from_millis(200),
            max_concurrent_cycles: DEFAULT_MAX_CONCURRENT_CYCLES,
        }
    }
}

/// What a scale run measured.
#[derive(Debug, Clone)]
pub struct ScaleReport {
    /// Cycles finished and judged: each target's first `rounds`.
    pub cycles: usize,
    /// Cycles not judged: a target's cycles after its first `rounds`, and those
    /// cancelled when the run stopped.
    pub cycles_not_judged: usize,
    /// Judged cycles that passed.
    pub passed: usize,
    /// Targets with at least one judged cycle.
    pub targets_run: usize,
    /// The first few judged cycles that did not pass: target, result, why.
    pub not_passed: Vec<String>,
    /// Scheduler lateness over every wake-up.
    pub lateness: Summary,
    /// How long after its firing time (jitter included) each cycle began running.
    pub start_delay: Summary,
    /// Cycles that waited for a slot of the cap.
    pub held_back: u64,
    /// Most judged cycles running at once.
    pub peak_concurrent: usize,
    /// Wall time from start to the stop.
    pub wall: Duration,
    /// Process CPU time (user + system) over the run.
    pub cpu: Duration,
    /// RSS before the first cycle, in bytes.
    pub rss_before: u64,
    /// Peak RSS sampled during the run, in bytes.
    pub rss_peak: u64,
    /// Median wall time of a judged cycle.
    pub cycle_p50: Duration,
}

impl ScaleReport {
    /// CPU time per judged cycle (the cycles cut short are not counted, their CPU is).
    pub fn cpu_per_cycle(&self) -> Duration {
        self.cpu / u32::try_from(self.cycles.max(1)).unwrap_or(u32::MAX)
    }

    /// Resident memory per concurrent cycle, in bytes.
    pub fn rss_per_concurrent_cycle(&self) -> u64 {
        self.rss_peak.saturating_sub(self.rss_before) / self.peak_concurrent.max(1) as u64
    }
}

/// One finished cycle: target, start, end, result, and why it did not pass.
type Finished = (String, DateTime<Utc>, DateTime<Utc>, CycleResult, Option<String>);

/// Keeps each target's first `rounds` cycles, and stops the run once every target has
/// them: cycles still running then are cancelled (and release their locks), so they
/// are not judged.
struct Collect {
    rounds: usize,
    targets: usize,
    stop: CancellationToken,
    state: Mutex<(Vec<Finished>, HashMap<String, usize>, usize)>,
}

impl Observer for Collect {
    fn step(&self, _target: &str, _check: &str, _message: &str) {}
    fn assertion(&self, _target: &str, _assertion: &Assertion) {}
    fn cycle_finished(&self, r: &CycleReport) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (kept, per_target, complete) = &mut *state;
        let n = per_target.entry(r.target.clone()).or_default();
        if *n == self.rounds {
            return;
        }
        *n += 1;
        if *n == self.rounds {
            *complete += 1;
        }
        let why = r.error.clone().or_else(|| r.assertions.iter().find(|a| a.failed()).map(Assertion::line));
        kept.push((r.target.clone(), r.started_at, r.finished_at, r.result, why));
        if *complete == self.targets {
            self.stop.cancel();
        }
    }
}

/// The most spans that overlap at one instant.
fn peak_overlap(spans: &[(DateTime<Utc>, DateTime<Utc>)]) -> usize {
    let mut edges: Vec<(DateTime<Utc>, i32)> = spans.iter().flat_map(|(s, e)| [(*s, 1), (*e, -1)]).collect();
    // Ends sort before starts at the same instant: touching spans do not overlap.
    edges.sort();
    let (mut open, mut peak) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        peak = peak.max(open);
    }
    peak as usize
}

/// Starts `config.services` reference services; returns each one's instance URLs and
/// the tasks to await after `shutdown`.
async fn start_services(
    config: &ScaleConfig,
    api_key: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<(Vec<Vec<String>>, Vec<tokio::task::JoinHandle<()>>)> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (mut urls, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..config.services.max(1) {
        let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(
            clock.clone(),
            MemoryStoreConfig { replica_lag: config.replication_bound, ..MemoryStoreConfig::default() },
        ));
        let service_config = ServiceConfig {
            cache_ttls: vec![config.cache_ttl],
            replication_bound: config.replication_bound,
            test_prefix: Some("probe-".into()),
            ..ServiceConfig::new(api_key)
        };
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let running = service::start(service_config, store, clock.clone(), vec![loopback, loopback], shutdown.clone())
            .await
            .context("starting a reference service")?;
        urls.push(running.addrs.iter().map(|a| format!("http://{a}")).collect());
        tasks.push(tokio::spawn(running.wait()));
    }
    Ok((urls, tasks))
}

/// Every target: its own name, test prefix and pool, on one of the services.
fn targets(
    config: &ScaleConfig,
    schedule: &cron::Schedule,
    services: &[Vec<String>],
    api_key: &str,
) -> Vec<(ProbeSettings, TargetSchedule)> {
    (0..config.targets)
        .map(|t| {
            let name = format!("t{t:04}");
            let prefix = format!("probe-{name}-");
            let instances = services[t % services.len()].clone();
            let settings = ProbeSettings {
                replication_bound: config.replication_bound,
                buffer: config.buffer,
                poll_interval: config.poll_interval,
                request_timeout: Duration::from_secs(30),
                ..ProbeSettings::short_run(&name, instances, api_key.to_owned(), &prefix)
            };
            let schedule = TargetSchedule {
                name,
                schedule: schedule.clone(),
                jitter: config.jitter,
                concurrency: 1,
                timeout: Duration::from_secs(600),
                pool: (1..=RESOURCES_PER_CYCLE).map(|i| format!("{prefix}{i}")).collect(),
            };
            (settings, schedule)
        })
        .collect()
}

/// Starts the services, runs every target until each has finished `rounds` cycles, and
/// measures. Give it a multi-threaded runtime.
pub async fn run(config: ScaleConfig) -> anyhow::Result<ScaleReport> {
    let schedule = parse_schedule(&config.schedule).map_err(anyhow::Error::msg)?;
    let api_key = hex::encode(rand::random::<[u8; 16]>());
    let shutdown = CancellationToken::new();
    let (services, service_tasks) = start_services(&config, &api_key, &shutdown).await?;

    let mut probe = Probe::new()?;
    probe.max_concurrent_cycles = config.max_concurrent_cycles;
    let stop = shutdown.child_token();
    let collect = Arc::new(Collect {
        rounds: config.rounds.max(1),
        targets: config.targets,
        stop: stop.clone(),
        state: Mutex::new((Vec::new(), HashMap::new(), 0)),
    });
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let rss_peak = Arc::new(AtomicU64::new(0));
    let sampling = CancellationToken::new();
    let sampler = tokio::spawn({
        let (rss_peak, sampling) = (rss_peak.clone(), sampling.clone());
        async move {
            while !sampling.is_cancelled() {
                rss_peak.fetch_max(measure::rss_bytes(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let (rss_before, cpu_before, started) = (measure::rss_bytes(), measure::process_cpu_time(), Instant::now());
    let targets = targets(&config, &schedule, &services, &api_key);
    let summary = probe.run(targets, Arc::new(StateFile::in_memory()), collect.clone(), listener, None, stop).await?;
    let (wall, cpu) = (started.elapsed(), measure::process_cpu_time().saturating_sub(cpu_before));
    sampling.cancel();
    sampler.await.ok();
    shutdown.cancel();
    for task in service_tasks {
        task.await.ok();
    }

    let cycles = collect.state.lock().unwrap_or_else(|e| e.into_inner()).0.clone();
    let spans: Vec<_> = cycles.iter().map(|(_, s, e, _, _)| (*s, *e)).collect();
    let mut lengths: Vec<Duration> = spans.iter().map(|(s, e)| (*e - *s).to_std().unwrap_or_default()).collect();
    lengths.sort();
    let mut names: Vec<&str> = cycles.iter().map(|(t, ..)| t.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Ok(ScaleReport {
        cycles: cycles.len(),
        cycles_not_judged: summary.cycles.saturating_sub(cycles.len()),
        passed: cycles.iter().filter(|c| c.3 == CycleResult::Passed).count(),
        targets_run: names.len(),
        not_passed: cycles
            .iter()
            .filter(|c| c.3 != CycleResult::Passed)
            .take(5)
            .map(|(t, _, _, r, why)| format!("{t}: {} {}", r.as_str(), why.as_deref().unwrap_or("")))
            .collect(),
        lateness: probe.metrics.schedule_lateness(),
        start_delay: probe.metrics.cycle_start_delay(),
        held_back: probe.metrics.cycles_held_back(),
        peak_concurrent: peak_overlap(&spans),
        wall,
        cpu,
        rss_before,
        rss_peak: rss_peak.load(Ordering::Relaxed),
        cycle_p50: lengths.get(lengths.len() / 2).copied().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn overlap_counts_spans_open_at_once() {
        let t = |s| Utc.timestamp_opt(s, 0).unwrap();
        assert_eq!(peak_overlap(&[]), 0);
        assert_eq!(peak_overlap(&[(t(0), t(10)), (t(5), t(15)), (t(12), t(20))]), 2);
        assert_eq!(peak_overlap(&[(t(0), t(10)), (t(10), t(20))]), 1, "touching is not overlapping");
    }
}
