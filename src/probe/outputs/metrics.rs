//! The probe's metrics: an explicit Prometheus [`Registry`] owned by [`Metrics`] (no global
//! statics), names and labels as the dashboards and alert rules use them, and every histogram mirrored in an
//! HDR histogram so the status API can report exact p50 / p75 / p99 / max.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    CounterVec, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};
use serde::{Deserialize, Serialize};

use crate::percentiles::{PhaseSummaries, Summary, WindowedPercentiles, DEFAULT_WINDOW};
use crate::probe::checks::report::{CycleReport, CycleResult};
use crate::probe::checks::vocabulary::Phase;

/// Metric registration failed (a programming error: duplicate or invalid names).
#[derive(Debug, thiserror::Error)]
#[error("metrics registration: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

use crate::exposition::{PHASE_BUCKETS, READ_THROUGH_BUCKETS};

/// Buckets for a whole probe cycle: seconds in tests, days in production.
const CYCLE_BUCKETS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0,
    259200.0,
];

/// Buckets for how late the scheduler woke for a firing: milliseconds when the process
/// keeps up, seconds when it is overloaded.
const LATENESS_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A delay exported as a histogram and kept for a day of exact percentiles (the
/// status page's figures): the scheduler's lateness and the cycles' start delay.
struct Delays {
    histogram: Histogram,
    window: Mutex<WindowedPercentiles>,
}

impl Delays {
    fn new(histogram: Histogram) -> Self {
        Self { histogram, window: Mutex::new(WindowedPercentiles::new(Duration::from_micros(1), DEFAULT_WINDOW)) }
    }

    fn record(&self, delay: Duration) {
        self.histogram.observe(delay.as_secs_f64());
        self.window.lock().unwrap_or_else(|e| e.into_inner()).record_seconds(Utc::now(), delay.as_secs_f64());
    }

    fn summary(&self) -> Summary {
        self.window.lock().unwrap_or_else(|e| e.into_inner()).summary(Utc::now())
    }
}

/// Recent values per (target, series), for the status API's exact percentiles.
#[derive(Default)]
struct Windows {
    by_key: HashMap<(String, String), WindowedPercentiles>,
}

impl Windows {
    fn record(&mut self, target: &str, series: &str, at: DateTime<Utc>, seconds: f64) {
        self.by_key
            .entry((target.to_string(), series.to_string()))
            // Microsecond steps: read-throughs take well under a millisecond.
            .or_insert_with(|| WindowedPercentiles::new(Duration::from_micros(1), DEFAULT_WINDOW))
            .record_seconds(at, seconds);
    }

    fn summary(&self, target: &str, series: &str, now: DateTime<Utc>) -> Summary {
        match self.by_key.get(&(target.to_string(), series.to_string())) {
            Some(w) => w.summary(now),
            None => Summary::default(),
        }
    }
}

/// Registers `collector` on `registry` and returns it.
fn register<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> Result<C, MetricsError> {
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, MetricsError> {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

/// A gauge per target.
fn gauge(registry: &Registry, name: &str, help: &str) -> Result<GaugeVec, MetricsError> {
    register(registry, GaugeVec::new(Opts::new(name, help), &["target"])?)
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> Result<HistogramVec, MetricsError> {
    register(registry, HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)?)
}

/// A metric vector with a `target` label whose series of one target can be removed.
trait TargetSeries {
    fn remove_target(&self, target: &str);
}

impl<T: MetricVecBuilder> TargetSeries for MetricVec<T> {
    fn remove_target(&self, target: &str) {
        for family in self.collect() {
            for metric in family.get_metric() {
                let labels: HashMap<&str, &str> = metric.get_label().iter().map(|l| (l.name(), l.value())).collect();
                if labels.get("target") == Some(&target) {
                    // Gone already if another caller removed it meanwhile: nothing to do.
                    let _ = self.remove(&labels);
                }
            }
        }
    }
}

/// The `percentiles` object of the status API: exact percentiles of the last day.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PercentilesDocument {
    /// How long a probe lock was held in each phase.
    pub lock_phase_duration_seconds: PhaseSummaries,
    /// Read-through latency the service reported in `Server-Timing`.
    pub read_through_latency_seconds: Summary,
    /// The same reads as the probe measured them, request to answer.
    pub read_through_client_seconds: Summary,
    /// Time each instance took to show a pre-lock.
    pub observed_convergence_seconds: Summary,
    /// The window the summaries cover, seconds: values recorded since this process
    /// started, at most this long ago (kept in quarters, so between three quarters of
    /// it and all of it).
    pub window_seconds: Option<f64>,
}

/// Every metric the probe exports.
pub struct Metrics {
    registry: Registry,
    runs: IntCounterVec,
    missed: IntCounterVec,
    claims: IntCounterVec,
    duration: HistogramVec,
    assertions: IntCounterVec,
    violations: IntCounterVec,
    inconclusive: IntCounterVec,
    phase_duration: HistogramVec,
    read_through: HistogramVec,
    read_through_client: HistogramVec,
    declared: GaugeVec,
    expected: GaugeVec,
    observed: GaugeVec,
    last_success: GaugeVec,
    convergence_violations: CounterVec,
    last_passed: GaugeVec,
    consecutive_failures: GaugeVec,
    unresolved: GaugeVec,
    convergence_unresolved: GaugeVec,
    schedule_interval: GaugeVec,
    cycle_timeout: GaugeVec,
    next_firing: GaugeVec,
    probed_since: GaugeVec,
    store_region_changes: IntCounterVec,
    schedule_lateness: Delays,
    start_delay: Delays,
    held_back: IntCounter,
    running_cycles: IntGauge,
    max_concurrent_cycles: IntGauge,
    state_file_writable: IntGauge,
    windows: Mutex<Windows>,
    /// Per target, the label sets of `unresolved` set to 1, to clear on a passing cycle.
    unresolved_series: Mutex<HashMap<String, Vec<[String; 4]>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Creates the metrics on a fresh registry.
    pub fn new() -> Result<Self, MetricsError> {
        let r = Registry::new();
        crate::exposition::register_process_metrics(&r)?;
        Ok(Self {
            runs: counter(&r, "lockprobe_probe_runs_total", "Probe cycles run, by result.", &["target", "result"])?,
            missed: counter(
                &r,
                "lockprobe_probe_missed_schedules_total",
                "Scheduled cycles that did not start (concurrency limit, empty pool or late wake-up).",
                &["target"],
            )?,
            claims: counter(
                &r,
                "lockprobe_probe_claims_total",
                "Claims on a group of test resources before a cycle: held (this replica runs it), busy (another replica of the same configuration holds it) or unavailable (the cycle ran unclaimed).",
                &["target", "outcome"],
            )?,
            duration: histogram(&r, "lockprobe_probe_duration_seconds", "Wall time of a probe cycle.", CYCLE_BUCKETS, &["target"])?,
            assertions: counter(
                &r,
                "lockprobe_assertions_total",
                "Probe assertions, by phase, operation, expected outcome and result.",
                &["target", "phase", "op", "expected", "result"],
            )?,
            violations: counter(
                &r,
                "lockprobe_enforcement_violations_total",
                "User operations whose allow / block / tombstone outcome was wrong for the lock phase.",
                &["target", "phase", "op", "expected", "observed"],
            )?,
            inconclusive: counter(
                &r,
                "lockprobe_probe_inconclusive_total",
                "Operations a check meant to hold to a lock whose decision window did not allow it (neither passed nor failed), by check.",
                &["target", "check"],
            )?,
            phase_duration: histogram(
                &r,
                "lockprobe_lock_phase_duration_seconds",
                "Time a probe lock spent in each phase.",
                PHASE_BUCKETS,
                &["target", "phase"],
            )?,
            read_through: histogram(
                &r,
                "lockprobe_read_through_latency_seconds",
                "Store time the service reported in Server-Timing for the write phase's reads, which must read through.",
                READ_THROUGH_BUCKETS,
                &["target"],
            )?,
            read_through_client: histogram(
                &r,
                "lockprobe_read_through_client_seconds",
                "The write phase's read-through reads as the probe measured them, request to answer.",
                READ_THROUGH_BUCKETS,
                &["target"],
            )?,
            declared: gauge(&r, "lockprobe_convergence_declared_seconds", "Convergence delay the service declared with the last pre-lock.")?,
            expected: gauge(&r, "lockprobe_convergence_expected_seconds", "Convergence delay the operator configured for the target.")?,
            observed: gauge(
                &r,
                "lockprobe_convergence_observed_seconds",
                "Slowest instance's time to show the last pre-lock on its routing path (at least the whole wait when one never did).",
            )?,
            last_success: gauge(&r, "lockprobe_last_success_timestamp_seconds", "Unix time of the last passed cycle.")?,
            convergence_violations: register(
                &r,
                CounterVec::new(
                    Opts::new(
                        "lockprobe_convergence_violations_total",
                        "Instances that did not show the pre-lock within the declared delay plus buffer.",
                    ),
                    &["target"],
                )?,
            )?,
            last_passed: gauge(
                &r,
                "lockprobe_probe_last_cycle_passed",
                "1 when the target's last cycle passed, 0 when it failed or errored (absent before the first).",
            )?,
            consecutive_failures: gauge(
                &r,
                "lockprobe_probe_consecutive_failures",
                "Cycles of the target that failed or errored since its last passed cycle.",
            )?,
            unresolved: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "lockprobe_enforcement_violation_unresolved",
                        "1 while an enforcement violation a cycle found has not been followed by a passed cycle of the target.",
                    ),
                    &["target", "phase", "op", "expected", "observed"],
                )?,
            )?,
            convergence_unresolved: gauge(
                &r,
                "lockprobe_convergence_violation_unresolved",
                "1 from a cycle that found an instance not showing the pre-lock within the declared delay plus buffer until a later cycle's convergence check passes on every instance.",
            )?,
            schedule_interval: gauge(
                &r,
                "lockprobe_probe_schedule_interval_seconds",
                "Seconds between the target's next firing and the one before it, by its cron schedule: what the alerts measure \"too long\" in.",
            )?,
            cycle_timeout: gauge(
                &r,
                "lockprobe_probe_cycle_timeout_seconds",
                "The target's cycle timeout: a longer cycle is cancelled and releases its locks.",
            )?,
            next_firing: gauge(
                &r,
                "lockprobe_probe_next_firing_timestamp_seconds",
                "Unix time of the target's next firing by its schedule (jitter not included).",
            )?,
            probed_since: gauge(
                &r,
                "lockprobe_probe_target_since_timestamp_seconds",
                "Unix time the process began probing the target (its start, or the reload that added the target).",
            )?,
            store_region_changes: counter(
                &r,
                "lockprobe_probe_store_region_changes_total",
                "Changes of the store region an instance reports in Server-Timing (a failover of the service's store), seen by the probe.",
                &["target"],
            )?,
            // One series for the process, not per target: lateness is the scheduler's
            // (a busy runtime delays every target alike), and a thousand targets would
            // make a thousand bucket sets.
            schedule_lateness: Delays::new(register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "lockprobe_probe_schedule_lateness_seconds",
                        "How long after its firing time (jitter included) the scheduler woke to start a cycle.",
                    )
                    .buckets(LATENESS_BUCKETS.to_vec()),
                )?,
            )?),
            // The scheduler's wake-up on its own thread says little about a cycle that
            // then waits for a slot of the cap or a busy runtime: this is the delay a
            // cycle's own requests saw, and the one a late cycle is alerted on.
            start_delay: Delays::new(register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "lockprobe_probe_cycle_start_delay_seconds",
                        "How long after its firing time (jitter included) a cycle began running: the scheduler's lateness, the wait for a slot of max_concurrent_cycles and for a thread of the runtime.",
                    )
                    .buckets(LATENESS_BUCKETS.to_vec()),
                )?,
            )?),
            held_back: register(
                &r,
                IntCounter::new(
                    "lockprobe_probe_cycles_held_back_total",
                    "Cycles that found every slot of max_concurrent_cycles taken and waited for one.",
                )?,
            )?,
            running_cycles: register(
                &r,
                IntGauge::new("lockprobe_probe_cycles_running", "Cycles of every target running now (holding a slot).")?,
            )?,
            max_concurrent_cycles: register(
                &r,
                IntGauge::new(
                    "lockprobe_probe_max_concurrent_cycles",
                    "The process's bound on cycles running at once (max_concurrent_cycles).",
                )?,
            )?,
            state_file_writable: {
                let gauge = register(
                    &r,
                    IntGauge::new(
                        "lockprobe_state_file_writable",
                        "1 while the state file takes writes, 0 after a write failed: the probe then sends no pre-lock (it would not be journaled), and its cycles end in error.",
                    )?,
                )?;
                gauge.set(1);
                gauge
            },
            registry: r,
            windows: Mutex::new(Windows::default()),
            unresolved_series: Mutex::new(HashMap::new()),
        })
    }

    /// The registry, for callers that add their own collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Makes the target's series exist (at zero) before its first cycle, so dashboards and
    /// absence alerts see it at once.
    pub fn register_target(&self, target: &str, expected_convergence: Option<f64>) {
        for result in ["passed", "failed", "error"] {
            self.runs.with_label_values(&[target, result]);
        }
        self.missed.with_label_values(&[target]);
        for outcome in ["held", "busy", "unavailable"] {
            self.claims.with_label_values(&[target, outcome]);
        }
        self.convergence_violations.with_label_values(&[target]);
        self.consecutive_failures.with_label_values(&[target]);
        for check in crate::probe::checks::scenario::checks() {
            self.inconclusive.with_label_values(&[target, check]);
        }
        self.store_region_changes.with_label_values(&[target]);
        self.convergence_unresolved.with_label_values(&[target]);
        let since = self.probed_since.with_label_values(&[target]);
        // A reload that keeps the target keeps when it began.
        if since.get() == 0.0 {
            since.set(Utc::now().timestamp_millis() as f64 / 1000.0);
        }
        if let Some(e) = expected_convergence {
            self.expected.with_label_values(&[target]).set(e);
        }
    }

    /// Removes every series of `target` (a target taken out of the configuration), so
    /// its last values do not linger as if it were still probed.
    pub fn remove_target(&self, target: &str) {
        let vecs: [&dyn TargetSeries; 24] = [
            &self.runs,
            &self.missed,
            &self.claims,
            &self.duration,
            &self.assertions,
            &self.violations,
            &self.inconclusive,
            &self.phase_duration,
            &self.read_through,
            &self.read_through_client,
            &self.declared,
            &self.expected,
            &self.observed,
            &self.last_success,
            &self.convergence_violations,
            &self.last_passed,
            &self.consecutive_failures,
            &self.unresolved,
            &self.convergence_unresolved,
            &self.schedule_interval,
            &self.cycle_timeout,
            &self.next_firing,
            &self.probed_since,
            &self.store_region_changes,
        ];
        for vec in vecs {
            vec.remove_target(target);
        }
        self.windows.lock().unwrap_or_else(|e| e.into_inner()).by_key.retain(|(t, _), _| t != target);
        self.unresolved_series.lock().unwrap_or_else(|e| e.into_inner()).remove(target);
    }

    /// Records the target's schedule as the scheduler sees it before each wait: the next
    /// firing, the interval that ends there and the cycle timeout. The alerts derive
    /// "too long" from them, so they are right at any schedule.
    pub fn record_schedule(
        &self,
        target: &str,
        next: Option<DateTime<Utc>>,
        interval: Option<Duration>,
        timeout: Duration,
    ) {
        match next {
            Some(t) => self.next_firing.with_label_values(&[target]).set(t.timestamp_millis() as f64 / 1000.0),
            // No further firing: nothing to wait for, and no series to say otherwise.
            None => {
                let _ = self.next_firing.remove_label_values(&[target]);
            }
        }
        if let Some(i) = interval {
            self.schedule_interval.with_label_values(&[target]).set(i.as_secs_f64());
        }
        self.cycle_timeout.with_label_values(&[target]).set(timeout.as_secs_f64());
    }

    /// Counts a scheduled cycle that did not start.
    pub fn record_missed(&self, target: &str, n: u64) {
        self.missed.with_label_values(&[target]).inc_by(n);
    }

    /// Records how late the scheduler woke for a firing.
    pub fn record_lateness(&self, lateness: Duration) {
        self.schedule_lateness.record(lateness);
    }

    /// Exact percentiles of the scheduler's lateness over the last day.
    pub fn schedule_lateness(&self) -> Summary {
        self.schedule_lateness.summary()
    }

    /// Records how long after its firing time a cycle began running.
    pub fn record_start_delay(&self, delay: Duration) {
        self.start_delay.record(delay);
    }

    /// Exact percentiles of the cycles' start delay over the last day.
    pub fn cycle_start_delay(&self) -> Summary {
        self.start_delay.summary()
    }

    /// Counts a cycle that waited for a slot of the process's cap.
    pub fn record_held_back(&self) {
        self.held_back.inc();
    }

    /// Cycles held back so far.
    pub fn cycles_held_back(&self) -> u64 {
        self.held_back.get()
    }

    /// Sets whether the state file takes writes (`lockprobe_state_file_writable`).
    pub fn set_state_file_writable(&self, writable: bool) {
        self.state_file_writable.set(i64::from(writable));
    }

    /// Sets how many cycles run now.
    pub fn set_running_cycles(&self, cycles: usize) {
        self.running_cycles.set(i64::try_from(cycles).unwrap_or(i64::MAX));
    }

    /// Sets the process's bound on cycles running at once.
    pub fn set_max_concurrent_cycles(&self, limit: usize) {
        self.max_concurrent_cycles.set(i64::try_from(limit).unwrap_or(i64::MAX));
    }

    /// Counts a claim on a group of test resources (`held`, `busy` or `unavailable`).
    pub fn record_claim(&self, target: &str, outcome: &str) {
        self.claims.with_label_values(&[target, outcome]).inc();
    }

    /// Records everything one cycle found.
    pub fn record_cycle(&self, r: &CycleReport) {
        let t = r.target.as_str();
        self.runs.with_label_values(&[t, r.result.as_str()]).inc();
        let wall = (r.finished_at - r.started_at).to_std().unwrap_or_default().as_secs_f64();
        self.duration.with_label_values(&[t]).observe(wall);
        for a in &r.assertions {
            let result = a.verdict();
            self.assertions.with_label_values(&[t, a.phase.as_str(), a.op.as_str(), a.expected.as_str(), result]).inc();
            if a.is_enforcement_violation() {
                self.violations
                    .with_label_values(&[t, a.phase.as_str(), a.op.as_str(), a.expected.as_str(), a.observed.as_str()])
                    .inc();
            }
        }
        for d in &r.decisions {
            self.inconclusive.with_label_values(&[t, &d.check]).inc_by(u64::from(d.inconclusive));
        }
        if !r.store_region_changes.is_empty() {
            self.store_region_changes.with_label_values(&[t]).inc_by(r.store_region_changes.len() as u64);
        }
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let at = r.finished_at;
        for (phase, secs) in &r.phase_durations {
            self.phase_duration.with_label_values(&[t, phase.as_str()]).observe(*secs);
            windows.record(t, &format!("phase:{phase}"), at, *secs);
        }
        for secs in &r.read_through_seconds {
            self.read_through.with_label_values(&[t]).observe(*secs);
            windows.record(t, "readThrough", at, *secs);
        }
        for secs in &r.read_through_client_seconds {
            self.read_through_client.with_label_values(&[t]).observe(*secs);
            windows.record(t, "readThroughClient", at, *secs);
        }
        if let Some(d) = r.declared_convergence_seconds {
            self.declared.with_label_values(&[t]).set(d);
        }
        if let Some(e) = r.expected_convergence_seconds {
            self.expected.with_label_values(&[t]).set(e);
        }
        for c in &r.observed_convergence {
            if let Some(s) = c.observed_seconds {
                windows.record(t, "convergence", at, s);
            } else {
                self.convergence_violations.with_label_values(&[t]).inc();
            }
        }
        // A cycle that checked convergence settles the question until the next one that
        // does; a cycle that ended before its check leaves it as it was.
        if !r.observed_convergence.is_empty() {
            let never = r.observed_convergence.iter().any(|c| c.observed_seconds.is_none());
            self.convergence_unresolved.with_label_values(&[t]).set(if never { 1.0 } else { 0.0 });
        }
        if let Some(max) = r.max_observed_convergence() {
            self.observed.with_label_values(&[t]).set(max);
        }
        if r.result == CycleResult::Passed {
            self.last_success.with_label_values(&[t]).set(r.finished_at.timestamp_millis() as f64 / 1000.0);
        }
        self.record_cycle_state(r);
    }

    /// The per-target state the alerts judge by cycles rather than by time windows
    /// (a cycle may come every 10 s or every 6 h): the last result, the failures since
    /// the last pass, and the violations no passed cycle has cleared yet.
    fn record_cycle_state(&self, r: &CycleReport) {
        let t = r.target.as_str();
        let passed = r.result == CycleResult::Passed;
        self.last_passed.with_label_values(&[t]).set(if passed { 1.0 } else { 0.0 });
        let failures = self.consecutive_failures.with_label_values(&[t]);
        if passed {
            failures.set(0.0);
        } else {
            failures.inc();
        }
        let mut series = self.unresolved_series.lock().unwrap_or_else(|e| e.into_inner());
        let known = series.entry(t.to_string()).or_default();
        if passed {
            // Kept at 0 rather than removed, so a dashboard shows it was cleared.
            for [phase, op, expected, observed] in known.iter() {
                self.unresolved.with_label_values(&[t, phase, op, expected, observed]).set(0.0);
            }
            known.clear();
            return;
        }
        for a in r.assertions.iter().filter(|a| a.is_enforcement_violation()) {
            let labels = [a.phase.as_str(), a.op.as_str(), a.expected.as_str(), a.observed.as_str()].map(String::from);
            self.unresolved.with_label_values(&[t, &labels[0], &labels[1], &labels[2], &labels[3]]).set(1.0);
            if !known.contains(&labels) {
                known.push(labels);
            }
        }
    }

    /// The `percentiles` object of the status API for `target`, over the window ending
    /// at `now`.
    pub fn percentiles(&self, target: &str, now: DateTime<Utc>) -> PercentilesDocument {
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let phase = |p: Phase| windows.summary(target, &format!("phase:{p}"), now);
        PercentilesDocument {
            lock_phase_duration_seconds: PhaseSummaries {
                pre_lock: phase(Phase::PreLock),
                hard_delete: phase(Phase::HardDelete),
                write: phase(Phase::Write),
            },
            read_through_latency_seconds: windows.summary(target, "readThrough", now),
            read_through_client_seconds: windows.summary(target, "readThroughClient", now),
            observed_convergence_seconds: windows.summary(target, "convergence", now),
            window_seconds: Some(DEFAULT_WINDOW.as_secs_f64()),
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        crate::exposition::render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::checks::report::CheckDecisions;
    use crate::probe::checks::report::{Assertion, InstanceConvergence};
    use crate::probe::checks::vocabulary::{Op, Outcome};
    use chrono::Utc;
    use std::time::Duration;

    fn a(op: Op, expected: Outcome, observed: Outcome) -> Assertion {
        Assertion {
            check: "cycle".into(),
            phase: Phase::Write,
            op,
            instance: None,
            passed: expected == observed,
            expected,
            observed,
            at: Utc::now(),
            duration: Duration::from_millis(1),
            detail: None,
            inconclusive: None,
        }
    }

    fn report() -> CycleReport {
        CycleReport {
            target: "demo".into(),
            resource: "probe-0001".into(),
            started_at: Utc::now(),
            finished_at: Utc::now(),
            result: CycleResult::Failed,
            error: None,
            assertions: vec![a(Op::Write, Outcome::Block, Outcome::Allow), a(Op::Read, Outcome::Allow, Outcome::Allow)],
            phase_durations: vec![(Phase::PreLock, 3.0), (Phase::Write, 1.0)],
            read_through_seconds: vec![0.001, 0.0015, 0.002],
            read_through_client_seconds: vec![0.002, 0.003],
            declared_convergence_seconds: Some(1.5),
            expected_convergence_seconds: Some(1.5),
            observed_convergence: vec![
                InstanceConvergence {
                    instance: "a".into(),
                    observed_seconds: Some(0.9),
                    bound_seconds: 2.0,
                    tolerance_seconds: 0.2,
                },
                InstanceConvergence {
                    instance: "b".into(),
                    observed_seconds: None,
                    bound_seconds: 2.0,
                    tolerance_seconds: 0.2,
                },
            ],
            notes: Vec::new(),
            store_region_changes: Vec::new(),
            declared_versions: Vec::new(),
            walk: Default::default(),
            decisions: Vec::new(),
        }
    }

    #[test]
    fn renders_design_names_and_labels() {
        let m = Metrics::new().unwrap();
        m.register_target("demo", Some(1.5));
        m.record_cycle(&report());
        let text = m.render();
        for needle in [
            r#"lockprobe_probe_runs_total{result="failed",target="demo"} 1"#,
            r#"lockprobe_enforcement_violations_total{expected="block",observed="allow",op="write",phase="write",target="demo"} 1"#,
            r#"lockprobe_assertions_total{expected="allow",op="read",phase="write",result="passed",target="demo"} 1"#,
            r#"lockprobe_lock_phase_duration_seconds_count{phase="preLock",target="demo"} 1"#,
            r#"lockprobe_read_through_latency_seconds_count{target="demo"} 3"#,
            r#"lockprobe_read_through_client_seconds_count{target="demo"} 2"#,
            r#"lockprobe_convergence_declared_seconds{target="demo"} 1.5"#,
            // Instance b never showed the lock within the 2s watched: the slowest took at
            // least that, above the 1.5s declared, which is what the alert compares.
            r#"lockprobe_convergence_observed_seconds{target="demo"} 2"#,
            r#"lockprobe_convergence_violations_total{target="demo"} 1"#,
            "lockprobe_probe_duration_seconds_bucket",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        // A failed cycle is not a success.
        assert!(!text.contains("lockprobe_last_success_timestamp_seconds{"), "{text}");
    }

    #[test]
    fn inconclusive_operations_are_counted_per_check_from_zero() {
        let m = Metrics::new().unwrap();
        m.register_target("demo", None);
        let text = m.render();
        // Every check's series exists before the first cycle, so the first
        // inconclusive operation is an increase a dashboard shows.
        for check in crate::probe::checks::scenario::checks() {
            let series = format!(r#"lockprobe_probe_inconclusive_total{{check="{check}",target="demo"}} 0"#);
            assert!(text.contains(&series), "missing {series} in\n{text}");
        }
        let mut r = report();
        let mut undecided = a(Op::Write, Outcome::Block, Outcome::Allow);
        undecided.passed = false;
        undecided.inconclusive = Some("the wall clock moved +1.500s".into());
        r.assertions.push(undecided);
        r.decisions = vec![CheckDecisions {
            check: "eager/renewal".into(),
            held: 10,
            inconclusive: 3,
            reasons: vec!["the wall clock moved +1.500s".into()],
            retried: 0,
        }];
        m.record_cycle(&r);
        let text = m.render();
        assert!(
            text.contains(r#"lockprobe_probe_inconclusive_total{check="eager/renewal",target="demo"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"lockprobe_assertions_total{expected="block",op="write",phase="write",result="inconclusive",target="demo"} 1"#),
            "{text}"
        );
        // An inconclusive operation is no enforcement violation.
        assert!(text.contains(r#"lockprobe_enforcement_violations_total{expected="block",observed="allow",op="write",phase="write",target="demo"} 1"#), "{text}");
    }

    #[test]
    fn cycle_state_counts_failures_and_holds_violations_until_a_pass() {
        let m = Metrics::new().unwrap();
        m.register_target("demo", None);
        let text = m.render();
        assert!(text.contains(r#"lockprobe_probe_consecutive_failures{target="demo"} 0"#), "{text}");
        assert!(!text.contains("lockprobe_probe_last_cycle_passed{"), "no cycle yet: {text}");
        let unresolved = r#"lockprobe_enforcement_violation_unresolved{expected="block",observed="allow",op="write",phase="write",target="demo"}"#;

        // A violating cycle, then one that fails otherwise: the violation still stands.
        m.record_cycle(&report());
        let mut other_failure = report();
        other_failure.assertions.clear();
        other_failure.result = CycleResult::Error;
        m.record_cycle(&other_failure);
        let text = m.render();
        assert!(text.contains(r#"lockprobe_probe_consecutive_failures{target="demo"} 2"#), "{text}");
        assert!(text.contains(r#"lockprobe_probe_last_cycle_passed{target="demo"} 0"#), "{text}");
        assert!(text.contains(&format!("{unresolved} 1")), "{text}");

        // A passed cycle resets both.
        let mut pass = report();
        pass.assertions.clear();
        pass.result = CycleResult::Passed;
        m.record_cycle(&pass);
        let text = m.render();
        assert!(text.contains(r#"lockprobe_probe_consecutive_failures{target="demo"} 0"#), "{text}");
        assert!(text.contains(r#"lockprobe_probe_last_cycle_passed{target="demo"} 1"#), "{text}");
        assert!(text.contains(&format!("{unresolved} 0")), "{text}");
    }

    /// Resolution where production sits: the write lock (13 s p50, 19 s p99) and
    /// read-through (~50 ms p99); and the process says what it is.
    #[test]
    fn buckets_resolve_the_production_figures_and_build_info_is_exported() {
        let m = Metrics::new().unwrap();
        m.record_cycle(&report());
        let text = m.render();
        let write: Vec<f64> = buckets(&text, "lockprobe_lock_phase_duration_seconds", "phase=\"write\"")
            .into_iter()
            .map(|(le, _)| le)
            .collect();
        let in_range: Vec<f64> = write.iter().copied().filter(|le| (10.0..=30.0).contains(le)).collect();
        assert_eq!(in_range.first(), Some(&10.0), "{write:?}");
        assert_eq!(in_range.last(), Some(&30.0), "{write:?}");
        assert!(in_range.windows(2).all(|w| w[1] - w[0] <= 2.5), "a gap wider than 2.5 s in {in_range:?}");
        let read: Vec<f64> = buckets(&text, "lockprobe_read_through_latency_seconds", "target=\"demo\"")
            .into_iter()
            .map(|(le, _)| le)
            .collect();
        for edge in [0.04, 0.05, 0.06, 0.075] {
            assert!(read.contains(&edge), "no {edge} s bucket in {read:?}");
        }
        assert!(
            text.contains(&format!(
                "lockprobe_build_info{{contract=\"{}\",formats_read=\"{}\",newest_format=\"{}\",version=\"{}\"}} 1",
                crate::versions::CONTRACT_VERSION,
                crate::versions::formats_read(),
                crate::versions::NEWEST_FORMAT,
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        #[cfg(target_os = "linux")]
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
    }

    #[test]
    fn hdr_percentiles_are_exact_and_empty_is_null() {
        let m = Metrics::new().unwrap();
        m.record_cycle(&report());
        let p = serde_json::to_value(m.percentiles("demo", Utc::now())).unwrap();
        assert_eq!(p["readThroughLatencySeconds"]["count"], 3);
        assert_eq!(p["readThroughLatencySeconds"]["p50"], 0.0015);
        assert_eq!(p["readThroughLatencySeconds"]["max"], 0.002);
        assert_eq!(p["lockPhaseDurationSeconds"]["preLock"]["count"], 1);
        assert_eq!(p["lockPhaseDurationSeconds"]["hardDelete"]["count"], 0);
        assert!(p["lockPhaseDurationSeconds"]["hardDelete"]["p50"].is_null());
        assert_eq!(p["observedConvergenceSeconds"]["count"], 1);
    }

    /// `(upper bound, cumulative count)` of the buckets of the series of histogram `name`
    /// whose label set contains `label`, read from the text format.
    fn buckets(text: &str, name: &str, label: &str) -> Vec<(f64, u64)> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket{{")) && l.contains(label))
            .map(|l| {
                let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
                (le, l.rsplit(' ').next().unwrap().parse().unwrap())
            })
            .collect()
    }

    /// Records `values` as read-through latencies or as preLock durations; returns the
    /// Prometheus buckets and the status API summary of that series.
    fn recorded(values: &[f64], phase: bool) -> (Vec<(f64, u64)>, serde_json::Value) {
        let m = Metrics::new().unwrap();
        let mut r = report();
        if phase {
            r.phase_durations = values.iter().map(|v| (Phase::PreLock, *v)).collect();
        } else {
            r.read_through_seconds = values.to_vec();
        }
        m.record_cycle(&r);
        let text = m.render();
        let p = serde_json::to_value(m.percentiles("demo", Utc::now())).unwrap();
        if phase {
            (
                buckets(&text, "lockprobe_lock_phase_duration_seconds", "phase=\"preLock\""),
                p["lockPhaseDurationSeconds"]["preLock"].clone(),
            )
        } else {
            (
                buckets(&text, "lockprobe_read_through_latency_seconds", "target=\"demo\""),
                p["readThroughLatencySeconds"].clone(),
            )
        }
    }

    proptest::proptest! {
        /// The status API's exact percentiles fall in the Prometheus bucket that holds the
        /// same rank: the two views of one histogram agree, from sub-millisecond
        /// read-throughs to two-day pre-locks.
        #[test]
        fn hdr_percentiles_agree_with_prometheus_buckets(
            values in proptest::collection::vec(0.00005f64..3.0, 1..200),
            phase_values in proptest::collection::vec(0.1f64..200_000.0, 1..50),
        ) {
            for (values, phase) in [(values, false), (phase_values, true)] {
                let (b, summary) = recorded(&values, phase);
                proptest::prop_assert_eq!(summary["count"].as_u64(), Some(values.len() as u64));
                proptest::prop_assert_eq!(b.last().unwrap().1, values.len() as u64);
                for (key, q) in [("p50", 0.5), ("p75", 0.75), ("p99", 0.99)] {
                    let rank = ((q * values.len() as f64).ceil() as u64).max(1);
                    let i = b.iter().position(|(_, c)| *c >= rank).unwrap();
                    let upper = b[i].0;
                    let lower = if i == 0 { 0.0 } else { b[i - 1].0 };
                    let hdr = summary[key].as_f64().unwrap();
                    // HDR keeps 3 significant digits; allow that much at the bucket edges.
                    proptest::prop_assert!(
                        hdr >= lower * 0.999 && hdr <= upper * 1.001,
                        "{} = {} outside bucket ({}, {}]", key, hdr, lower, upper
                    );
                }
            }
        }
    }

    /// A convergence breach holds from the cycle that found it until a later cycle's
    /// convergence check passes; a cycle that ended before its check changes nothing.
    #[test]
    fn a_convergence_breach_holds_until_a_later_check_passes() {
        let m = Metrics::new().unwrap();
        m.register_target("demo", None);
        let gauge = |m: &Metrics| {
            let text = m.render();
            let line = text
                .lines()
                .find(|l| l.starts_with(r#"lockprobe_convergence_violation_unresolved{target="demo"}"#))
                .unwrap_or_else(|| panic!("no gauge: {text}"))
                .to_owned();
            line.rsplit(' ').next().unwrap().to_owned()
        };
        assert_eq!(gauge(&m), "0", "exists at 0 before the first cycle");
        m.record_cycle(&report());
        assert_eq!(gauge(&m), "1", "instance b never converged");
        let mut early_error = report();
        early_error.observed_convergence.clear();
        early_error.result = CycleResult::Error;
        m.record_cycle(&early_error);
        assert_eq!(gauge(&m), "1", "no check, no news");
        let mut converged = report();
        converged.observed_convergence.retain(|c| c.observed_seconds.is_some());
        m.record_cycle(&converged);
        assert_eq!(gauge(&m), "0");
    }

    #[test]
    fn the_schedule_is_exported_per_target() {
        let m = Metrics::new().unwrap();
        m.register_target("demo", None);
        let next = DateTime::parse_from_rfc3339("2026-12-04T18:00:00Z").unwrap().to_utc();
        m.record_schedule("demo", Some(next), Some(Duration::from_secs(6 * 3600)), Duration::from_secs(60 * 3600));
        let text = m.render();
        for line in [
            r#"lockprobe_probe_schedule_interval_seconds{target="demo"} 21600"#,
            r#"lockprobe_probe_cycle_timeout_seconds{target="demo"} 216000"#,
            r#"lockprobe_probe_next_firing_timestamp_seconds{target="demo"} 1796407200"#,
        ] {
            assert!(text.contains(line), "{line} missing: {text}");
        }
        assert!(text.contains(r#"lockprobe_probe_target_since_timestamp_seconds{target="demo"} 1"#), "{text}");
        m.record_schedule("demo", None, None, Duration::from_secs(60));
        assert!(!m.render().contains("lockprobe_probe_next_firing_timestamp_seconds{"), "no next firing, no series");
    }

    #[test]
    fn a_removed_target_loses_every_series_and_the_others_keep_theirs() {
        let m = Metrics::new().unwrap();
        for t in ["demo", "other"] {
            m.register_target(t, Some(1.5));
            m.record_cycle(&CycleReport { target: t.into(), ..report() });
            m.record_claim(t, "held");
            m.record_schedule(t, Some(Utc::now()), Some(Duration::from_secs(10)), Duration::from_secs(60));
        }
        let text = m.render();
        assert!(text.contains(r#"target="demo""#) && text.contains("lockprobe_enforcement_violation_unresolved{"));
        m.remove_target("demo");
        let text = m.render();
        assert!(!text.contains(r#"target="demo""#), "{text}");
        assert!(text.contains(r#"lockprobe_probe_runs_total{result="failed",target="other"} 1"#), "{text}");
        // Every summary empty; only the window's length (the same for every target) stays.
        let empty = |p: PercentilesDocument| PercentilesDocument { window_seconds: None, ..p };
        assert_eq!(empty(m.percentiles("demo", Utc::now())), PercentilesDocument::default());
        assert_ne!(empty(m.percentiles("other", Utc::now())), PercentilesDocument::default());
    }

    #[test]
    fn scheduler_lateness_is_one_histogram_with_exact_percentiles_beside_it() {
        let m = Metrics::new().unwrap();
        for ms in [2, 20, 20, 700] {
            m.record_lateness(Duration::from_millis(ms));
        }
        let text = m.render();
        for line in [
            "lockprobe_probe_schedule_lateness_seconds_bucket{le=\"0.001\"} 0",
            "lockprobe_probe_schedule_lateness_seconds_bucket{le=\"0.025\"} 3",
            "lockprobe_probe_schedule_lateness_seconds_bucket{le=\"1\"} 4",
            "lockprobe_probe_schedule_lateness_seconds_count 4",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        let summary = m.schedule_lateness();
        assert_eq!(summary.count, 4);
        let p50 = summary.p50.unwrap();
        assert!((0.0199..0.0201).contains(&p50), "{p50}");
        let max = summary.max.unwrap();
        assert!((0.699..0.701).contains(&max), "{max}");
    }
}
