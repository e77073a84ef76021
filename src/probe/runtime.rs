//! The long-running probe (`serve`, and the probe half of `demo`): every target on its
//! schedule, results into metrics and status, the HTTP server beside it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::metrics::Metrics;
use super::observer::Observer;
use super::report::{CycleReport, CycleResult};
use super::scenario::Scenario;
use super::scheduler::{run_target, Claim, CycleRunner, CycleSink, TargetSchedule, WallClock};
use super::server::{self, AppState};
use super::settings::ProbeSettings;
use super::state::StateFile;
use super::status::ProbeStatus;
use super::target::TargetError;

/// Why the probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A target's HTTP client could not be built.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The probe's HTTP server failed.
    #[error("http server: {0}")]
    Server(#[from] std::io::Error),
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    /// Cycles finished.
    pub cycles: usize,
    /// Cycles that did not pass.
    pub unsuccessful: usize,
}

/// Records cycles into metrics and status; stops the run after a number of cycles.
struct Sink {
    metrics: Arc<Metrics>,
    status: Arc<ProbeStatus>,
    cycles: AtomicUsize,
    unsuccessful: AtomicUsize,
    stop_after: Option<usize>,
    stop: CancellationToken,
}

impl CycleSink for Sink {
    fn cycle(&self, report: &CycleReport) {
        self.metrics.record_cycle(report);
        self.status.record_cycle(report);
        if report.result != CycleResult::Passed {
            self.unsuccessful.fetch_add(1, Ordering::SeqCst);
        }
        let done = self.cycles.fetch_add(1, Ordering::SeqCst) + 1;
        if self.stop_after.is_some_and(|n| done >= n) {
            self.stop.cancel();
        }
    }

    fn missed(&self, target: &str, n: u64) {
        self.metrics.record_missed(target, n);
        self.status.add_missed(target, n);
    }

    fn woke(&self, _target: &str, lateness: std::time::Duration) {
        self.metrics.record_lateness(lateness);
    }

    fn claimed(&self, target: &str, claim: &Claim) {
        let outcome = match claim {
            Claim::Held { .. } => "held",
            Claim::Busy => "busy",
            Claim::Unavailable => "unavailable",
        };
        self.metrics.record_claim(target, outcome);
    }
}

/// The probe's shared parts, created before the run so callers can read them.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Metrics of every target.
    pub metrics: Arc<Metrics>,
    /// Status of every target.
    pub status: Arc<ProbeStatus>,
    /// More routes for the probe's HTTP server (the process hosting the probe may run
    /// other parts, such as the convergence monitor, that the probe knows nothing of).
    pub extra_routes: Option<axum::Router>,
}

impl Probe {
    /// Fresh metrics and status.
    pub fn new() -> Result<Self, super::metrics::MetricsError> {
        Ok(Self { metrics: Arc::new(Metrics::new()?), status: Arc::new(ProbeStatus::new()), extra_routes: None })
    }

    /// Runs every target on its schedule, serving HTTP on `listener`, until `shutdown`
    /// fires or `stop_after` cycles have finished. Locks left in `state` by a previous run
    /// are released first; running cycles are cancelled (and release) on the way out.
    pub async fn run(
        &self,
        targets: Vec<(ProbeSettings, TargetSchedule)>,
        state: Arc<StateFile>,
        observer: Arc<dyn Observer>,
        listener: TcpListener,
        stop_after: Option<usize>,
        shutdown: CancellationToken,
    ) -> Result<RunSummary, RuntimeError> {
        let stop = shutdown.child_token();
        let sink = Arc::new(Sink {
            metrics: self.metrics.clone(),
            status: self.status.clone(),
            cycles: AtomicUsize::new(0),
            unsuccessful: AtomicUsize::new(0),
            stop_after,
            stop: stop.clone(),
        });
        let mut scenarios = Vec::new();
        for (settings, schedule) in targets {
            let expected = settings.expected_convergence.map(|d| d.as_secs_f64());
            self.metrics.register_target(&settings.name, expected);
            self.status.add_target(&settings.name, &settings.instances, expected);
            scenarios.push((Arc::new(Scenario::new(settings, state.clone(), observer.clone())?), schedule));
        }
        self.status.set_config_loaded(true);

        let server_stop = CancellationToken::new();
        let server = tokio::spawn(server::serve(
            listener,
            AppState { metrics: self.metrics.clone(), status: self.status.clone() },
            self.extra_routes.clone(),
            server_stop.clone(),
        ));

        let mut schedulers = JoinSet::new();
        for (scenario, schedule) in scenarios {
            let span = tracing::info_span!("target", target = %schedule.name);
            let cleared = scenario.recover().instrument(span.clone()).await;
            if cleared > 0 {
                tracing::info!(target_name = %schedule.name, cleared, "released locks left by a previous run");
            }
            let runner: Arc<dyn CycleRunner> = scenario;
            schedulers
                .spawn(run_target(schedule, runner, sink.clone(), WallClock::system(), stop.clone()).instrument(span));
        }
        self.status.set_scheduler_running(true);
        tracing::info!("probe running");
        while let Some(res) = schedulers.join_next().await {
            if let Err(e) = res {
                tracing::error!(error = %e, "scheduler task failed");
            }
        }
        self.status.set_scheduler_running(false);
        server_stop.cancel();
        match server.await {
            Ok(r) => r?,
            Err(e) => tracing::error!(error = %e, "http server task failed"),
        }
        Ok(RunSummary {
            cycles: sink.cycles.load(Ordering::SeqCst),
            unsuccessful: sink.unsuccessful.load(Ordering::SeqCst),
        })
    }
}
