//! `lockprobe demo`: the embedded default. In one process: the in-memory store, the
//! reference service with two instances on loopback, and the probe on a compressed
//! schedule, printing each step and serving its metrics on a local port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

mod fleet;

use super::store::{OpenStoreError, StoreArgs, StoreKind};
use super::tasks::{Background, GRACE};
use crate::app::usage::UsageError;
use crate::clock::{Clock, SystemClock};
use crate::monitor::{http as monitor_http, Monitor, MonitorConfig, MonitorStatus};
use crate::probe::checks::observer::PrintObserver;
use crate::probe::checks::settings::{AdminKeys, ProbeSettings, RESOURCES_PER_CYCLE};
use crate::probe::checks::state::StateFile;
use crate::probe::engine::runtime::Probe;
use crate::probe::engine::scheduler::{parse_schedule, TargetSchedule};
use crate::service::AdminPrincipal;
use crate::service::{self, ServiceConfig};
use crate::store::LocationStore;

/// Flags of `lockprobe demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Stop after this many cycles; exit 0 only if every assertion passed.
    #[arg(long)]
    pub cycles: Option<usize>,
    /// Address of the probe's HTTP server (`/metrics`, `/api/v1/status`, `/`).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Cron schedule of the demo target (seconds first).
    #[arg(long, default_value = "*/10 * * * * *")]
    pub schedule: String,
    /// Cache TTL of the service's single cache tier.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1s")]
    pub cache_ttl: Duration,
    /// Replication bound of the in-memory store (its replicas lag by this much).
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "500ms")]
    pub replication_bound: Duration,
    /// Probe buffer on top of the declared convergence delay.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "500ms")]
    pub buffer: Duration,
    /// The oldest routing decision the service acts on (as `lockprobe service
    /// --max-decision-age`): a store read slower than this is refused (503). Raise it
    /// for a slow or distant store, e.g. `--store cosmos` against a busy emulator.
    #[arg(long, value_parser = crate::duration::parse_bounded_duration, default_value = "1s")]
    pub max_decision_age: Duration,
    /// Run no simulated fleet beside the probe: the monitor then sees only the probe's
    /// own migrations. By default a few migrations a minute of `fleet-*` resources (one
    /// orphaned, one escalated early) show what the monitor page is for.
    #[arg(long)]
    pub no_fleet: bool,
    /// Routing store selection (--store memory|cosmos and the --cosmos-* flags).
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Runs the demo; returns the exit code.
pub async fn run(args: DemoArgs, shutdown: CancellationToken) -> anyhow::Result<u8> {
    let schedule = check(&args)?;
    // At once: starting the parts and waiting for the first scheduled cycle take seconds.
    println!("{}", starting_line(&args, &schedule, chrono::Utc::now()));
    let api_key = hex::encode(rand::random::<[u8; 16]>());
    // Two admin principals, so every cycle shows the force-release check too.
    let admins = AdminKeys {
        requester: hex::encode(rand::random::<[u8; 16]>()),
        approver: hex::encode(rand::random::<[u8; 16]>()),
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut probe = Probe::new()?;
    // Store metrics (Cosmos request charges) are served with the probe's own.
    let store = args
        .store
        .open(clock.clone(), args.replication_bound, probe.metrics.registry())
        .await
        .map_err(OpenStoreError::into_anyhow)?;
    let background = Background::new();
    let monitor = start_monitor(&args, &store, &clock, &probe, &background)?;
    probe.extra_routes = Some(monitor_http::router(monitor.clone()));
    if !args.no_fleet {
        let settings = fleet::FleetSettings {
            cache_ttl: args.cache_ttl,
            declared: args.cache_ttl + args.replication_bound,
            buffer: args.buffer,
        };
        background.spawn("demo fleet", fleet::run(store.clone(), clock.clone(), settings, background.token()));
    }
    let registry = probe.metrics.registry().clone();
    let instances = start_service(&args, &api_key, &admins, store, clock, registry, &background).await?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    print_banner(&args, &instances, listener.local_addr()?);

    let summary = probe
        .run(
            vec![probe_target(&args, schedule, instances, api_key, admins)],
            Arc::new(StateFile::in_memory()),
            Arc::new(PrintObserver::default()),
            listener,
            args.cycles,
            shutdown,
        )
        .await?;
    // The probe has released its locks through the service; now the rest may stop.
    background.stop(GRACE).await;
    // One last look, so the summary includes the final cycle's migrations.
    monitor.drain().await.ok();
    println!();
    print_monitor_summary(&monitor.status());
    let decided = summary.cycles - summary.interrupted;
    match summary.interrupted {
        0 => println!("lockprobe demo: {} cycle(s), {} not passed", summary.cycles, summary.unsuccessful),
        n => println!(
            "lockprobe demo: {decided} cycle(s), {} not passed, {n} interrupted by the stop (neither passed nor failed)",
            summary.unsuccessful
        ),
    }
    Ok(if summary.unsuccessful == 0 && decided > 0 { 0 } else { 1 })
}

/// The flags a demo cannot run with are usage errors, found before anything starts;
/// returns the schedule.
fn check(args: &DemoArgs) -> Result<cron::Schedule, UsageError> {
    let schedule = parse_schedule(&args.schedule).map_err(|e| UsageError::new(format!("--schedule: {e}")))?;
    if args.cycles == Some(0) {
        return Err(UsageError::new("--cycles: must be at least 1"));
    }
    args.store.validate().map_err(|e| UsageError::new(e.to_string()))?;
    Ok(schedule)
}

/// The convergence monitor over the demo's own store, so the probe's migrations appear
/// in it; its metrics join the probe's and its status is served at /api/v1/monitor.
fn start_monitor(
    args: &DemoArgs,
    store: &Arc<dyn LocationStore>,
    clock: &Arc<dyn Clock>,
    probe: &Probe,
    background: &Background,
) -> anyhow::Result<Arc<Monitor>> {
    let config = MonitorConfig {
        escalation_buffer: args.buffer,
        declared_delay: Some(args.cache_ttl + args.replication_bound),
        sweep_interval: Duration::from_secs(1),
        lapse_grace: Duration::from_secs(1),
        scan_interval: Duration::from_secs(30),
        ..MonitorConfig::default()
    };
    let monitor = Arc::new(Monitor::new(store.clone(), clock.clone(), config, probe.metrics.registry())?);
    background.spawn("monitor", monitor.clone().run(background.token()));
    Ok(monitor)
}

/// The reference service, two instances on loopback, its metrics (the size of what its
/// lock calls write) joining the probe's on `registry`; returns their base URLs.
async fn start_service(
    args: &DemoArgs,
    api_key: &str,
    admins: &AdminKeys,
    store: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    registry: prometheus::Registry,
    background: &Background,
) -> anyhow::Result<Vec<String>> {
    let config = ServiceConfig {
        cache_ttls: vec![args.cache_ttl],
        replication_bound: args.replication_bound,
        test_prefix: Some("probe-".into()),
        max_decision_age: args.max_decision_age,
        metrics: Some(registry),
        admin_principals: [("demo-requester", &admins.requester), ("demo-approver", &admins.approver)]
            .into_iter()
            .map(|(name, key)| AdminPrincipal { name: name.into(), key: key.clone(), prefixes: vec!["probe-".into()] })
            .collect(),
        ..ServiceConfig::new(api_key)
    };
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let running = service::start(config, store, clock, vec![loopback, loopback], background.token())
        .await
        .context("starting the reference service")?;
    let instances = running.addrs.iter().map(|a| format!("http://{a}")).collect();
    background.spawn("service", running.wait());
    Ok(instances)
}

/// The demo's one target: its settings and its compressed schedule.
fn probe_target(
    args: &DemoArgs,
    schedule: cron::Schedule,
    instances: Vec<String>,
    api_key: String,
    admins: AdminKeys,
) -> (ProbeSettings, TargetSchedule) {
    let settings = ProbeSettings {
        expected_convergence: Some(args.cache_ttl + args.replication_bound),
        replication_bound: args.replication_bound,
        buffer: args.buffer,
        request_timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(100),
        force_release: Some(admins),
        ..ProbeSettings::short_run("demo", instances, api_key, "probe-")
    };
    let target = TargetSchedule {
        name: "demo".into(),
        schedule,
        jitter: Duration::ZERO,
        concurrency: 1,
        timeout: Duration::from_secs(120),
        pool: (1..=RESOURCES_PER_CYCLE * 2).map(|i| format!("probe-{i:04}")).collect(),
    };
    (settings, target)
}

/// The one line printed before anything starts: what is starting and when the first
/// cycle begins.
fn starting_line(args: &DemoArgs, schedule: &cron::Schedule, now: chrono::DateTime<chrono::Utc>) -> String {
    let first = schedule.after(&now).next().map(|t| t.format("%H:%M:%S UTC").to_string());
    format!(
        "lockprobe demo: starting the {} routing store, 2 reference service instances and the probe; first cycle at {} (schedule {:?})",
        match args.store.kind {
            StoreKind::Memory => "in-memory",
            StoreKind::Cosmos => "Cosmos DB",
        },
        first.as_deref().unwrap_or("never"),
        args.schedule
    )
}

/// Where everything is, for the person who started the demo.
fn print_banner(args: &DemoArgs, instances: &[String], probe_addr: SocketAddr) {
    println!("lockprobe demo");
    println!("  reference service instances: {}", instances.join(", "));
    println!("  probe metrics:  http://{probe_addr}/metrics");
    println!("  probe status:   http://{probe_addr}/  (JSON at /api/v1/status)");
    println!("  monitor:        http://{probe_addr}/api/v1/monitor");
    println!(
        "  schedule {:?}, cache TTL {}, replication bound {}, buffer {}{}",
        args.schedule,
        humantime::format_duration(args.cache_ttl),
        humantime::format_duration(args.replication_bound),
        humantime::format_duration(args.buffer),
        args.cycles.map(|n| format!(", stopping after {n} cycle(s)")).unwrap_or_default()
    );
    println!();
}

/// Two lines a person can read: what the monitor saw of the fleet's migrations (none in
/// the demo) and of the probe's own.
fn print_monitor_summary(status: &MonitorStatus) {
    let m = status.migrations;
    println!(
        "monitor: {} swapped, {} released, {} force-released, {} lapsed; early escalations {}, partial cutovers {}, orphaned locks {}",
        m.swapped,
        m.released,
        m.force_released,
        m.lapsed,
        status.early_escalations,
        status.partial_cutovers,
        status.orphaned_locks,
    );
    let p = &status.probe;
    println!(
        "monitor, the probe's own locks (apart, not alerted on): {} swapped, {} released, {} force-released, {} lapsed, orphaned locks {} (the lease-lapse check leaves one by design)",
        p.migrations.swapped,
        p.migrations.released,
        p.migrations.force_released,
        p.migrations.lapsed,
        p.orphaned_locks,
    );
}
