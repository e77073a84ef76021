//! The long-running probe (`serve`, and the probe half of `demo`): every target on its
//! schedule, results into metrics and status, the HTTP server beside it.
//!
//! The running targets can be changed as one ([`TargetControl::apply`], `serve`'s
//! reload): a target left out of a change keeps its schedule and its cycles in flight;
//! a changed one takes its new settings from its next cycle; a removed one starts no
//! new cycle, lets the one in flight finish, releases what its state-file entries still
//! hold, and only then loses its metrics series and status.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::reload::Reload;
use super::scheduler::{
    run_target_plans, Claim, CycleCap, CycleRoom, CycleSink, ScheduleView, Stops, TargetPlan, TargetSchedule, WallClock,
};
use super::server::{self, AppState};
use crate::probe::checks::observer::Observer;
use crate::probe::checks::report::{CycleReport, CycleResult};
use crate::probe::checks::scenario::Scenario;
use crate::probe::checks::settings::ProbeSettings;
use crate::probe::checks::state::StateFile;
use crate::probe::checks::target::{HttpClients, TargetError};
use crate::probe::outputs::metrics::Metrics;
use crate::probe::outputs::status::ProbeStatus;

/// Why the probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A target's HTTP client could not be built.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The probe's HTTP server failed.
    #[error("http server: {0}")]
    Server(#[from] std::io::Error),
    /// The schedules' thread could not be started.
    #[error("scheduler thread: {0}")]
    Scheduler(std::io::Error),
}

/// Why a change to the running targets was not applied (nothing of it was).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A target's HTTP client could not be built.
    #[error("target {name}: {source}")]
    Target {
        /// The target.
        name: String,
        /// Why.
        source: TargetError,
    },
    /// The probe is stopping or has stopped.
    #[error("the probe is shutting down")]
    Stopped,
}

/// A change to the running targets, applied as one.
#[derive(Default)]
pub struct TargetChanges {
    /// Targets to start, or whose settings changed (matched by name).
    pub start_or_update: Vec<(ProbeSettings, TargetSchedule)>,
    /// Names of targets to stop.
    pub remove: Vec<String>,
}

struct Command {
    changes: TargetChanges,
    reply: oneshot::Sender<Result<(), ControlError>>,
}

/// Changes the targets of a running [`Probe::run_controlled`]; changes are applied one
/// at a time, in the order they are sent.
#[derive(Debug, Clone)]
pub struct TargetControl(mpsc::Sender<Command>);

/// The receiving end of a [`TargetControl`], handed to [`Probe::run_controlled`].
#[derive(Debug)]
pub struct ControlInbox(mpsc::Receiver<Command>);

/// A control and the inbox it sends to.
pub fn target_control() -> (TargetControl, ControlInbox) {
    let (tx, rx) = mpsc::channel(1);
    (TargetControl(tx), ControlInbox(rx))
}

impl TargetControl {
    /// Applies `changes` once the run has taken them; the targets are running (or
    /// retiring) as asked when this returns, with cycles in flight still in flight.
    pub async fn apply(&self, changes: TargetChanges) -> Result<(), ControlError> {
        let (reply, answer) = oneshot::channel();
        self.0.send(Command { changes, reply }).await.map_err(|_| ControlError::Stopped)?;
        answer.await.map_err(|_| ControlError::Stopped)?
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    /// Cycles finished, the interrupted ones included.
    pub cycles: usize,
    /// Cycles that did not pass (interrupted ones not counted: they decided nothing).
    pub unsuccessful: usize,
    /// Cycles cut short because the run was stopping (a signal, the last of `--cycles`).
    pub interrupted: usize,
}

/// Whether `report` is of a cycle the run's stop cut short: it ended in an error that
/// says it was cancelled, and the run is stopping. It decided nothing, so it is neither
/// a pass nor a failure.
fn interrupted(report: &CycleReport, stop: &CancellationToken) -> bool {
    report.result == CycleResult::Error
        && stop.is_cancelled()
        && report.error.as_deref().is_some_and(|e| e.contains("cancelled"))
}

/// Records cycles into metrics and status; stops the run after a number of cycles.
struct Sink {
    metrics: Arc<Metrics>,
    status: Arc<ProbeStatus>,
    /// Whether it takes writes is shown after every cycle (a gauge, readiness).
    state: Arc<StateFile>,
    cycles: AtomicUsize,
    unsuccessful: AtomicUsize,
    interrupted: AtomicUsize,
    stop_after: Option<usize>,
    stop: CancellationToken,
}

impl CycleSink for Sink {
    fn cycle(&self, report: &CycleReport) {
        self.metrics.record_cycle(report);
        self.status.record_cycle(report);
        let failure = self.state.write_failure();
        self.metrics.set_state_file_writable(failure.is_none());
        self.status.set_state_file_failure(failure);
        if interrupted(report, &self.stop) {
            self.interrupted.fetch_add(1, Ordering::SeqCst);
        } else if report.result != CycleResult::Passed {
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

    fn held_back(&self, _target: &str) {
        self.metrics.record_held_back();
    }

    fn started(&self, _target: &str, delay: std::time::Duration) {
        self.metrics.record_start_delay(delay);
    }

    fn running(&self, cycles: usize) {
        self.metrics.set_running_cycles(cycles);
    }

    fn scheduled(&self, target: &str, view: &ScheduleView) {
        self.metrics.record_schedule(target, view.next, view.interval, view.timeout);
        self.status.set_schedule(target, &view.expression, view.last, view.next, view.interval);
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
    /// The HTTP server's bounds (connections, the time to send a request head).
    pub limits: crate::listener::Limits,
    /// The HTTP server's TLS and authentication (`--web.config.file`); none by default.
    pub guards: crate::listener::Guards,
    /// What `POST /-/reload` calls (`serve`, which knows the configuration file); without
    /// it the route does not exist.
    pub reload: Option<Arc<dyn Reload>>,
    /// Cycles of all targets that may run at once (`serve`'s `max_concurrent_cycles`).
    pub max_concurrent_cycles: usize,
    /// One HTTP client per distinct TLS configuration, shared by the targets.
    clients: Arc<HttpClients>,
}

pub use super::config::DEFAULT_MAX_CONCURRENT_CYCLES;

impl Probe {
    /// Fresh metrics and status.
    pub fn new() -> Result<Self, crate::probe::outputs::metrics::MetricsError> {
        Ok(Self {
            metrics: Arc::new(Metrics::new()?),
            status: Arc::new(ProbeStatus::new()),
            extra_routes: None,
            limits: crate::listener::Limits::default(),
            guards: crate::listener::Guards::open(),
            reload: None,
            max_concurrent_cycles: DEFAULT_MAX_CONCURRENT_CYCLES,
            clients: Arc::default(),
        })
    }

    /// Runs every target on its schedule, serving HTTP on `listener`, until `shutdown`
    /// fires, `stop_after` cycles have finished or every schedule has ended. Locks left
    /// in `state` by a previous run are released first; running cycles are cancelled
    /// (and release) on the way out.
    pub async fn run(
        &self,
        targets: Vec<(ProbeSettings, TargetSchedule)>,
        state: Arc<StateFile>,
        observer: Arc<dyn Observer>,
        listener: TcpListener,
        stop_after: Option<usize>,
        shutdown: CancellationToken,
    ) -> Result<RunSummary, RuntimeError> {
        self.run_controlled(targets, state, observer, listener, stop_after, shutdown, None).await
    }

    /// [`Probe::run`], with the targets changed through `control`'s `TargetControl`
    /// while it runs. With a control the run lasts until `shutdown` (or `stop_after`),
    /// also when every schedule has ended: a change may bring new ones.
    #[allow(clippy::too_many_arguments)]
    pub async fn run_controlled(
        &self,
        targets: Vec<(ProbeSettings, TargetSchedule)>,
        state: Arc<StateFile>,
        observer: Arc<dyn Observer>,
        listener: TcpListener,
        stop_after: Option<usize>,
        shutdown: CancellationToken,
        control: Option<ControlInbox>,
    ) -> Result<RunSummary, RuntimeError> {
        let stop = shutdown.child_token();
        let sink = Arc::new(Sink {
            metrics: self.metrics.clone(),
            status: self.status.clone(),
            state: state.clone(),
            cycles: AtomicUsize::new(0),
            unsuccessful: AtomicUsize::new(0),
            interrupted: AtomicUsize::new(0),
            stop_after,
            stop: stop.clone(),
        });
        let changeable = control.is_some();
        let scheduler = SchedulerThread::start().map_err(RuntimeError::Scheduler)?;
        let cap = Arc::new(CycleCap::new(self.max_concurrent_cycles));
        self.metrics.set_max_concurrent_cycles(cap.limit());
        let room = CycleRoom { runtime: Some(tokio::runtime::Handle::current()), cap: Some(cap) };
        let mut running = Targets {
            changeable,
            ..Targets::new(self, state, observer, sink.clone(), stop.clone(), room, scheduler.handle.clone())
        };
        let mut scenarios = Vec::new();
        for (settings, schedule) in targets {
            scenarios.push((running.register(settings, &schedule.name)?, schedule));
        }
        self.status.set_config_loaded(true);

        let server_stop = CancellationToken::new();
        let server = tokio::spawn(server::serve(
            listener,
            AppState { metrics: self.metrics.clone(), status: self.status.clone(), reload: self.reload.clone() },
            self.extra_routes.clone(),
            self.limits,
            self.guards.clone(),
            server_stop.clone(),
        ));

        // Each target releases what a previous run left in its own task, all at once and
        // each within a deadline: a target whose instances never answer delays only its
        // own first cycle, and readiness and reloads never wait on a target's network.
        for (scenario, schedule) in scenarios {
            running.start(TargetPlan { schedule, runner: scenario }, true);
        }
        self.status.set_scheduler_running(true);
        tracing::info!("probe running");
        running.run(control).await;
        self.status.set_scheduler_running(false);
        server_stop.cancel();
        match server.await {
            Ok(r) => r?,
            Err(e) => tracing::error!(error = %e, "http server task failed"),
        }
        Ok(RunSummary {
            cycles: sink.cycles.load(Ordering::SeqCst),
            unsuccessful: sink.unsuccessful.load(Ordering::SeqCst),
            interrupted: sink.interrupted.load(Ordering::SeqCst),
        })
    }
}

/// How many firings of `cron` fall after `from` and at or before `to` (at most a
/// million: a seconds schedule over a long stall is counted, not walked forever).
fn firings_between(cron: &cron::Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    cron.after(&from).take_while(|t| *t <= to).take(1_000_000).count() as u64
}

/// A thread of its own for the targets' schedules, running nothing but their timers
/// (and the cheap bookkeeping around a firing), so that cycle work on the process's
/// runtime cannot delay a wake-up. Its runtime stops when this is dropped.
struct SchedulerThread {
    handle: tokio::runtime::Handle,
    _stop: oneshot::Sender<()>,
}

impl SchedulerThread {
    fn start() -> std::io::Result<Self> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new().name("lockprobe-scheduler".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = handle_tx.send(Err(e));
                    return;
                }
            };
            let _ = handle_tx.send(Ok(runtime.handle().clone()));
            // Drives the schedules' tasks until the sender is dropped.
            runtime.block_on(async move {
                let _ = stopped.await;
            });
        })?;
        let handle = handle_rx
            .recv()
            .map_err(|_| std::io::Error::other("the scheduler thread ended before its runtime started"))??;
        Ok(Self { handle, _stop: stop })
    }
}

/// A running target's handles.
struct Slot {
    generation: u64,
    /// `None` without a control: the settings never change, and a schedule with no
    /// further firing times ends the target.
    plans: Option<watch::Sender<TargetPlan>>,
    retire: CancellationToken,
    /// Cancelled when the target's task has ended (cycles done, leftovers released).
    done: CancellationToken,
}

/// How a target's task ended.
struct Ended {
    name: String,
    generation: u64,
    retired: bool,
}

/// The targets of one run: those running, those retiring, and their tasks.
struct Targets<'a> {
    probe: &'a Probe,
    state: Arc<StateFile>,
    observer: Arc<dyn Observer>,
    sink: Arc<Sink>,
    stop: CancellationToken,
    /// Where cycles run, within the process's cap.
    room: CycleRoom,
    /// The runtime of the schedules' own thread.
    scheduler: tokio::runtime::Handle,
    active: HashMap<String, Slot>,
    /// Removed targets whose cycles are still finishing: a target added again under the
    /// same name waits for them (the same test resources, the same state-file entries).
    retiring: HashMap<String, (u64, CancellationToken)>,
    tasks: JoinSet<Ended>,
    generations: u64,
    /// The run has a control: targets wait for new settings when their schedule ends.
    changeable: bool,
}

impl<'a> Targets<'a> {
    fn new(
        probe: &'a Probe,
        state: Arc<StateFile>,
        observer: Arc<dyn Observer>,
        sink: Arc<Sink>,
        stop: CancellationToken,
        room: CycleRoom,
        scheduler: tokio::runtime::Handle,
    ) -> Self {
        Self {
            probe,
            state,
            observer,
            sink,
            stop,
            room,
            scheduler,
            active: HashMap::new(),
            retiring: HashMap::new(),
            tasks: JoinSet::new(),
            generations: 0,
            changeable: false,
        }
    }

    /// The target's scenario, with its series and status entry made to exist.
    fn register(&self, settings: ProbeSettings, name: &str) -> Result<Arc<Scenario>, TargetError> {
        let scenario = Arc::new(self.scenario(settings)?);
        self.show(name, scenario.settings());
        Ok(scenario)
    }

    /// The target's scenario, on the HTTP client for its TLS configuration.
    fn scenario(&self, settings: ProbeSettings) -> Result<Scenario, TargetError> {
        Scenario::sharing(settings, &self.probe.clients, self.state.clone(), self.observer.clone())
    }

    /// Makes the target's series and status entry exist, with its current settings.
    fn show(&self, name: &str, settings: &ProbeSettings) {
        let expected = settings.expected_convergence.map(|d| d.as_secs_f64());
        self.probe.metrics.register_target(name, expected);
        self.probe.status.add_target(name, &settings.instances, expected);
    }

    /// Starts a target's task; `recover_first`: release what a previous run of the
    /// target left in the state file before the first cycle.
    fn start(&mut self, plan: TargetPlan, recover_first: bool) {
        let name = plan.schedule.name.clone();
        self.generations += 1;
        let generation = self.generations;
        let (plans, updates) = watch::channel(plan);
        let (retire, done) = (CancellationToken::new(), CancellationToken::new());
        let predecessor = self.retiring.get(&name).map(|(_, done)| done.clone());
        let stops = Stops { retire: retire.clone(), shutdown: self.stop.clone() };
        let (sink, task_done) = (self.sink.clone(), done.clone());
        let (room, scheduler) = (self.room.clone(), self.scheduler.clone());
        let span = tracing::info_span!("target", target = %name);
        let task_name = name.clone();
        self.tasks.spawn(
            async move {
                let _done = task_done.drop_guard();
                if let Some(predecessor) = predecessor {
                    predecessor.cancelled().await;
                }
                let latest = updates.clone();
                if recover_first && !stops.shutdown.is_cancelled() {
                    let (runner, cron) = {
                        let plan = latest.borrow();
                        (plan.runner.clone(), plan.schedule.schedule.clone())
                    };
                    let began = Utc::now();
                    tokio::select! {
                        cleared = runner.release_leftovers() => if cleared > 0 {
                            tracing::info!(cleared, "released locks left by a previous run");
                        },
                        _ = stops.shutdown.cancelled() => {}
                    }
                    // The schedule starts from now: firings that came while the leftovers
                    // were being released did not start, and are counted as missed.
                    let lost = firings_between(&cron, began, Utc::now());
                    if lost > 0 {
                        tracing::warn!(
                            lost,
                            "scheduled cycles did not start while the locks a previous run left were released"
                        );
                        sink.missed(&task_name, lost);
                    }
                }
                // The schedule's timers on their own thread, its cycles back on this runtime.
                let schedule =
                    run_target_plans(updates, sink as Arc<dyn CycleSink>, WallClock::system(), stops.clone(), room);
                if let Err(e) = scheduler.spawn(schedule.in_current_span()).await {
                    tracing::error!(error = %e, "target schedule failed");
                }
                let retired = stops.retire.is_cancelled() && !stops.shutdown.is_cancelled();
                if retired {
                    // No later cycle of this target will retry a release that failed.
                    let runner = latest.borrow().runner.clone();
                    let cleared = runner.release_leftovers().await;
                    tracing::info!(cleared, "removed target stopped after its cycles in flight");
                }
                Ended { name: task_name, generation, retired }
            }
            .instrument(span),
        );
        let plans = self.changeable.then_some(plans);
        self.active.insert(name, Slot { generation, plans, retire, done });
    }

    /// Applies one change, all of it or (when a target cannot be built) none of it.
    fn apply(&mut self, changes: TargetChanges) -> Result<(), ControlError> {
        if self.stop.is_cancelled() {
            return Err(ControlError::Stopped);
        }
        let mut built = Vec::new();
        for (settings, schedule) in changes.start_or_update {
            let name = schedule.name.clone();
            let scenario = self.scenario(settings).map_err(|source| ControlError::Target { name, source })?;
            built.push((scenario, schedule));
        }
        for name in changes.remove {
            if let Some(slot) = self.active.remove(&name) {
                slot.retire.cancel();
                self.retiring.insert(name.clone(), (slot.generation, slot.done));
                tracing::info!(target_name = %name, "target removed: no new cycles, the one in flight finishes");
            }
        }
        for (scenario, schedule) in built {
            let name = schedule.name.clone();
            self.show(&name, scenario.settings());
            let plan = TargetPlan { schedule, runner: Arc::new(scenario) };
            match self.active.get(&name) {
                Some(Slot { plans: Some(plans), .. }) => {
                    plans.send_replace(plan);
                    tracing::info!(target_name = %name, "target changed: new settings from its next cycle");
                }
                _ => {
                    self.start(plan, true);
                    tracing::info!(target_name = %name, "target added");
                }
            }
        }
        Ok(())
    }

    /// Bookkeeping of a target's task that ended: a removed target's series and status
    /// go, unless it has been added again meanwhile.
    fn ended(&mut self, ended: Ended) {
        let Ended { name, generation, retired } = ended;
        if self.active.get(&name).is_some_and(|s| s.generation == generation) {
            self.active.remove(&name);
        }
        if self.retiring.get(&name).is_some_and(|(g, _)| *g == generation) {
            self.retiring.remove(&name);
        }
        if retired && !self.active.contains_key(&name) {
            self.probe.metrics.remove_target(&name);
            self.probe.status.remove_target(&name);
        }
    }

    /// Runs until the stop token fires or, without a control, every target has ended;
    /// then waits for the targets' tasks (whose cycles the stop cancels).
    async fn run(&mut self, mut control: Option<ControlInbox>) {
        while !(self.tasks.is_empty() && control.is_none()) {
            let command = async {
                match control.as_mut() {
                    Some(inbox) => inbox.0.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.stop.cancelled() => break,
                command = command => match command {
                    Some(Command { changes, reply }) => {
                        let _ = reply.send(self.apply(changes));
                    }
                    // Every control dropped: no more changes can come.
                    None => control = None,
                },
                Some(joined) = self.tasks.join_next() => {
                    match joined {
                        Ok(ended) => self.ended(ended),
                        Err(e) => tracing::error!(error = %e, "target task failed"),
                    }
                    if self.tasks.is_empty() && control.is_none() {
                        break;
                    }
                }
            }
        }
        // Changes sent from now on are refused; so are those already queued.
        if let Some(mut inbox) = control {
            inbox.0.close();
            while let Ok(Command { reply, .. }) = inbox.0.try_recv() {
                let _ = reply.send(Err(ControlError::Stopped));
            }
        }
        while let Some(joined) = self.tasks.join_next().await {
            match joined {
                Ok(ended) => self.ended(ended),
                Err(e) => tracing::error!(error = %e, "target task failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;
    use std::time::Duration;

    use super::*;
    use crate::probe::checks::observer::TracingObserver;
    use crate::probe::checks::settings::{Leases, RESOURCES_PER_CYCLE};

    /// A target that never fires (year 2099) and so never sends a request.
    fn idle(name: &str) -> (ProbeSettings, TargetSchedule) {
        let settings = ProbeSettings {
            name: name.into(),
            instances: vec!["http://127.0.0.1:9".into()],
            api_key: "k".into(),
            test_prefix: "probe-".into(),
            locations: ["westeurope".into(), "northeurope".into()],
            expected_convergence: Some(Duration::from_secs(2)),
            replication_bound: Duration::from_secs(1),
            buffer: Duration::from_secs(1),
            leases: Leases::short_run(),
            request_timeout: Duration::from_secs(1),
            poll_interval: Duration::from_millis(50),
            concurrent_pre_locks: 2,
            owner: format!("lockprobe/{name}"),
            eager: false,
            force_release: None,
            max_inconclusive: crate::probe::checks::settings::DEFAULT_MAX_INCONCLUSIVE,
            clock: std::sync::Arc::new(crate::clock::SystemClock),
            tls: Default::default(),
        };
        let schedule = TargetSchedule {
            name: name.into(),
            schedule: cron::Schedule::from_str("0 0 0 1 1 * 2099").unwrap(),
            jitter: Duration::ZERO,
            concurrency: 1,
            timeout: Duration::from_secs(60),
            pool: (1..=RESOURCES_PER_CYCLE).map(|i| format!("probe-{name}-{i:04}")).collect(),
        };
        (settings, schedule)
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        for _ in 0..100 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test]
    async fn changes_apply_one_at_a_time_and_none_after_shutdown() {
        let probe = Probe::new().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (control, inbox) = target_control();
        let shutdown = CancellationToken::new();
        let p = probe.clone();
        let stop = shutdown.clone();
        let run = tokio::spawn(async move {
            p.run_controlled(
                vec![idle("a")],
                Arc::new(StateFile::in_memory()),
                Arc::new(TracingObserver),
                listener,
                None,
                stop,
                Some(inbox),
            )
            .await
        });
        until("a to run", || probe.status.ready()).await;

        // Concurrent changes: each applied whole, in some order; b..e end up running.
        let sends = ["b", "c", "d", "e"].map(|name| {
            let control = control.clone();
            tokio::spawn(async move {
                control.apply(TargetChanges { start_or_update: vec![idle(name)], remove: vec!["a".into()] }).await
            })
        });
        for send in sends {
            send.await.unwrap().unwrap();
        }
        let names = || probe.status.document(&probe.metrics).targets.into_iter().map(|t| t.name).collect::<Vec<_>>();
        until("a to be gone", || names() == ["b", "c", "d", "e"]).await;
        assert!(!probe.metrics.render().contains(r#"target="a""#));
        assert!(probe.metrics.render().contains(r#"target="e""#));

        // Every schedule idle, and the run stays for further changes until shutdown.
        assert!(!run.is_finished());
        shutdown.cancel();
        let summary = run.await.unwrap().unwrap();
        assert_eq!(summary.cycles, 0);
        let refused = control.apply(TargetChanges { start_or_update: vec![idle("f")], remove: vec![] }).await;
        assert!(matches!(refused, Err(ControlError::Stopped)), "{refused:?}");
    }

    #[tokio::test]
    async fn without_a_control_the_run_ends_with_its_last_schedule() {
        let probe = Probe::new().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (settings, mut schedule) = idle("past");
        schedule.schedule = cron::Schedule::from_str("0 0 0 1 1 * 2020").unwrap();
        let run = probe.run(
            vec![(settings, schedule)],
            Arc::new(StateFile::in_memory()),
            Arc::new(TracingObserver),
            listener,
            None,
            CancellationToken::new(),
        );
        let summary = tokio::time::timeout(Duration::from_secs(10), run).await.expect("the run ends").unwrap();
        assert_eq!(summary.cycles, 0);
    }
}
