//! `lockprobe bench`: the two lock designs head to head under the same load.
//!
//! For each fraction f of migrating resources and each design ([`LockDesign`]), one
//! load run ([`load::run`]) on a fresh store; a run of the whole matrix gives the ratios
//! between the designs, measured side by side; `--runs N` repeats the matrix and
//! reports the median of every figure and every ratio. The store is the memory store
//! slowed to Cosmos DB's latencies ([`LatencyModel`]), or with `--store cosmos` a real
//! Cosmos DB endpoint (the local one of `scripts/setup-cosmos.sh` included).
//!
//! Lock reads are counted by the store (`crate::store::counting`): the reads a user
//! operation makes to learn the lock. In the record design those are its lock-record
//! reads; in the embedded design the lock travels in the routing document, and the
//! reads it causes are the write-region read-throughs of a started lock. One formula
//! covers both: lock-record reads plus write-region reads of routing documents (the
//! record design's routing documents never carry a lock, and the embedded design has no
//! lock records). Routing reads are the replica reads of cache misses, the same cache
//! tiers in both designs.
//!
//! Document sizes: every version the orchestration's lock calls write is measured as
//! stored, by lock phase (`crate::harness::sizes`), and reported per design and
//! fraction (over several runs, each figure's largest), against contract 1.3's budget.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::store::{OpenStoreError, StoreArgs, StoreKind};
use crate::app::usage::UsageError;
use crate::clock::{Clock, SystemClock};
use crate::duration::parse_bounded_duration;
use crate::harness::load::{self, LoadResult, LoadSpec};
use crate::harness::sizes::SizeTable;
use crate::service::LockDesign;
use crate::store::latency::{LatencyModel, LatencyStore};
use crate::store::memory::{MemoryStore, MemoryStoreConfig};
use crate::store::LocationStore;

/// Flags of `lockprobe bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Lock designs to compare (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["embedded", "record"])]
    pub designs: Vec<LockDesign>,
    /// Fractions of resources migrating at any moment (comma-separated; `1%` or `0.01`).
    #[arg(long, value_delimiter = ',', value_parser = parse_fraction, default_values = ["0.1%", "1%", "10%"])]
    pub fractions: Vec<f64>,
    /// Repeat the whole matrix this many times and report medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Resources in the population.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub resources: u64,
    /// Service instances over the one store, each with its own cache.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub instances: u16,
    /// User operations per second on each instance (80% reads, 15% writes, 5% deletes).
    #[arg(long, default_value_t = 1000.0, value_parser = parse_rate)]
    pub rate: f64,
    /// Measured time of each run.
    #[arg(long, value_parser = parse_bounded_duration, default_value = "10s")]
    pub duration: Duration,
    /// Load before measuring (caches fill, migrations spread out).
    #[arg(long, value_parser = parse_bounded_duration, default_value = "5s")]
    pub warmup: Duration,
    /// TTL of the routing cache (one tier); the convergence delay follows from it.
    #[arg(long, value_parser = parse_bounded_duration, default_value = "5s")]
    pub cache_ttl: Duration,
    /// Replication bound (the memory store's replicas lag by it).
    #[arg(long, value_parser = parse_bounded_duration, default_value = "500ms")]
    pub replication_bound: Duration,
    /// Skew margin.
    #[arg(long, value_parser = parse_bounded_duration, default_value = "100ms")]
    pub skew_margin: Duration,
    /// Oldest decision acted on (the swap waits it out after the write lock began).
    #[arg(long, value_parser = parse_bounded_duration, default_value = "250ms")]
    pub max_decision_age: Duration,
    /// How long each migration holds hardDelete and write (the copy's time).
    #[arg(long, value_parser = parse_bounded_duration, default_value = "500ms")]
    pub phase_hold: Duration,
    /// Item keys per resource.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub keys: u64,
    /// Memory store: latency of a replica read, `MIN..MAX` (uniform) or one value.
    #[arg(long, value_parser = parse_latency, default_value = "3ms..8ms")]
    pub replica_read_latency: (Duration, Duration),
    /// Memory store: latency of a write-region read.
    #[arg(long, value_parser = parse_latency, default_value = "3ms..8ms")]
    pub write_region_read_latency: (Duration, Duration),
    /// Memory store: latency of a write.
    #[arg(long, value_parser = parse_latency, default_value = "5ms..10ms")]
    pub write_latency: (Duration, Duration),
    /// Memory store: round trip to the write region, added to its reads and to writes
    /// (0: the instances sit in the write region).
    #[arg(long, value_parser = parse_bounded_duration, default_value = "0s")]
    pub write_region_rtt: Duration,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Routing store (--store memory|cosmos and the --cosmos-* flags).
    #[command(flatten)]
    pub store: StoreArgs,
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    let value = match text.trim().strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => text.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{text:?} is not a fraction (e.g. 1% or 0.01)"))?;
    if !(value > 0.0 && value <= 1.0) {
        return Err(format!("{text:?} must be above 0 and at most 100%"));
    }
    Ok(value)
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate > 0.0 && rate <= 1_000_000.0 => Ok(rate),
        _ => Err(format!("{text:?} must be a number of operations per second, above 0 and at most 1000000")),
    }
}

fn bounded(text: &str) -> Result<Duration, String> {
    parse_bounded_duration(text.trim()).map_err(|e| e.to_string())
}

fn parse_latency(text: &str) -> Result<(Duration, Duration), String> {
    let (low, high) = match text.split_once("..") {
        Some((low, high)) => (bounded(low)?, bounded(high)?),
        None => {
            let fixed = bounded(text)?;
            (fixed, fixed)
        }
    };
    if low > high {
        return Err(format!("{text:?}: the minimum is above the maximum"));
    }
    Ok((low, high))
}

impl BenchArgs {
    fn latency_model(&self) -> LatencyModel {
        let range = |(low, high): (Duration, Duration)| low..=high;
        LatencyModel {
            replica_read: range(self.replica_read_latency),
            write_region_read: range(self.write_region_read_latency),
            write: range(self.write_latency),
            write_region_round_trip: self.write_region_rtt,
        }
    }

    /// Checks what clap cannot: every fraction leaves at least one resource migrating.
    pub fn validate(&self) -> Result<(), UsageError> {
        if let Some(f) = self.fractions.iter().find(|f| (self.resources as f64 * **f).round() < 1.0) {
            return Err(UsageError::new(format!(
                "--resources {} leaves no resource migrating at --fractions {}; use at least {}",
                self.resources,
                percent(*f),
                (1.0 / f).ceil()
            )));
        }
        if self.designs.is_empty() {
            return Err(UsageError::new("--designs names no design"));
        }
        Ok(())
    }

    fn spec(&self, design: LockDesign, migrating: f64, prefix: String) -> LoadSpec {
        LoadSpec {
            design,
            migrating,
            resources: self.resources as usize,
            instances: usize::from(self.instances),
            rate: self.rate,
            duration: self.duration,
            warmup: self.warmup,
            cache_ttl: self.cache_ttl,
            replication_bound: self.replication_bound,
            skew_margin: self.skew_margin,
            max_decision_age: self.max_decision_age,
            phase_hold: self.phase_hold,
            keys: self.keys as usize,
            prefix,
        }
    }
}

fn percent(f: f64) -> String {
    format!("{}%", (f * 100.0 * 1000.0).round() / 1000.0)
}

/// The figures of one load run, per user operation where that applies.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    /// User operations answered in the window.
    pub user_ops: f64,
    /// Reads made to learn the lock, per user operation.
    pub lock_reads_per_op: f64,
    /// Of those, lock-record reads.
    pub lock_record_reads_per_op: f64,
    /// Of those, write-region reads of routing documents (read-throughs).
    pub routing_write_region_reads_per_op: f64,
    /// Replica reads of routing documents (cache misses), per user operation.
    pub routing_reads_per_op: f64,
    /// Latency percentiles, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// User operations per wall-clock second.
    pub ops_per_second: f64,
    /// User operations per CPU-second of the whole process (load generator and
    /// orchestration included, the same for both designs).
    pub ops_per_cpu_second: f64,
    /// Share of user operations refused by a write lock.
    pub blocked_share: f64,
    /// User operations that failed (5xx).
    pub errors: f64,
    /// Migrations that swapped in the window.
    pub migrations: f64,
}

impl Figures {
    /// The figures of `r`.
    pub fn of(r: &LoadResult) -> Self {
        let ops = r.user_ops.max(1) as f64;
        let u = &r.user_calls;
        let lock_record = u.lock.reads() as f64;
        let read_through = u.routing.read_write_region as f64;
        let ms = |q: f64| r.latency_us.value_at_quantile(q) as f64 / 1000.0;
        Self {
            user_ops: r.user_ops as f64,
            lock_reads_per_op: (lock_record + read_through) / ops,
            lock_record_reads_per_op: lock_record / ops,
            routing_write_region_reads_per_op: read_through / ops,
            routing_reads_per_op: u.routing.read_replica as f64 / ops,
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            ops_per_second: r.user_ops as f64 / r.wall.as_secs_f64().max(1e-9),
            ops_per_cpu_second: r.user_ops as f64 / r.cpu.as_secs_f64().max(1e-9),
            blocked_share: r.blocked as f64 / ops,
            errors: r.errors as f64,
            migrations: r.migrations as f64,
        }
    }
}

/// The ratios between the designs at one fraction, from one run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratios {
    /// Record's lock reads per operation over embedded's. When the embedded design made
    /// no lock read at all, its count is taken as 1 and this is a lower bound.
    pub lock_reads: f64,
    /// Whether [`Ratios::lock_reads`] is a lower bound.
    pub lock_reads_lower_bound: bool,
    /// Embedded's p99 over record's (at most 1: embedded no worse).
    pub p99: f64,
    /// Embedded's operations per CPU-second over record's.
    pub ops_per_cpu_second: f64,
}

impl Ratios {
    fn between(embedded: &LoadResult, record: &LoadResult) -> Self {
        let (e, r) = (Figures::of(embedded), Figures::of(record));
        let e_reads = embedded.user_calls.lock.reads() + embedded.user_calls.routing.read_write_region;
        let lower_bound = e_reads == 0;
        let e_per_op = if lower_bound { 1.0 / embedded.user_ops.max(1) as f64 } else { e.lock_reads_per_op };
        Self {
            lock_reads: r.lock_reads_per_op / e_per_op,
            lock_reads_lower_bound: lower_bound,
            p99: e.p99_ms / r.p99_ms.max(1e-9),
            ops_per_cpu_second: e.ops_per_cpu_second / r.ops_per_cpu_second.max(1e-9),
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Every run's results, by fraction then design.
#[derive(Debug, Default)]
pub struct Matrix {
    /// `(fraction, design, run results)`.
    pub cells: Vec<(f64, LockDesign, Vec<LoadResult>)>,
}

impl Matrix {
    fn push(&mut self, fraction: f64, design: LockDesign, result: LoadResult) {
        match self.cells.iter_mut().find(|(f, d, _)| *f == fraction && *d == design) {
            Some((_, _, results)) => results.push(result),
            None => self.cells.push((fraction, design, vec![result])),
        }
    }

    fn results(&self, fraction: f64, design: LockDesign) -> &[LoadResult] {
        self.cells.iter().find(|(f, d, _)| *f == fraction && *d == design).map_or(&[], |(_, _, r)| r)
    }

    /// The median of each figure over the runs of one cell.
    pub fn median_figures(&self, fraction: f64, design: LockDesign) -> Option<Figures> {
        let results = self.results(fraction, design);
        if results.is_empty() {
            return None;
        }
        let figures: Vec<Figures> = results.iter().map(Figures::of).collect();
        let m = |get: fn(&Figures) -> f64| median(figures.iter().map(get).collect());
        Some(Figures {
            user_ops: m(|f| f.user_ops),
            lock_reads_per_op: m(|f| f.lock_reads_per_op),
            lock_record_reads_per_op: m(|f| f.lock_record_reads_per_op),
            routing_write_region_reads_per_op: m(|f| f.routing_write_region_reads_per_op),
            routing_reads_per_op: m(|f| f.routing_reads_per_op),
            p50_ms: m(|f| f.p50_ms),
            p99_ms: m(|f| f.p99_ms),
            p999_ms: m(|f| f.p999_ms),
            ops_per_second: m(|f| f.ops_per_second),
            ops_per_cpu_second: m(|f| f.ops_per_cpu_second),
            blocked_share: m(|f| f.blocked_share),
            errors: m(|f| f.errors),
            migrations: m(|f| f.migrations),
        })
    }

    /// The sizes of the documents written over the runs of one cell (each figure's
    /// largest over the runs, see `SizeTable::worst_of`).
    pub fn document_sizes(&self, fraction: f64, design: LockDesign) -> Option<SizeTable> {
        let results = self.results(fraction, design);
        (!results.is_empty()).then(|| SizeTable::worst_of(results.iter().map(|r| &r.document_sizes)))
    }

    /// The median of each ratio over the runs (each ratio taken within one run).
    pub fn median_ratios(&self, fraction: f64) -> Option<Ratios> {
        let (e, r) = (self.results(fraction, LockDesign::Embedded), self.results(fraction, LockDesign::Record));
        if e.is_empty() || e.len() != r.len() {
            return None;
        }
        let each: Vec<Ratios> = e.iter().zip(r).map(|(e, r)| Ratios::between(e, r)).collect();
        Some(Ratios {
            lock_reads: median(each.iter().map(|x| x.lock_reads).collect()),
            lock_reads_lower_bound: each.iter().any(|x| x.lock_reads_lower_bound),
            p99: median(each.iter().map(|x| x.p99).collect()),
            ops_per_cpu_second: median(each.iter().map(|x| x.ops_per_cpu_second).collect()),
        })
    }
}

/// Runs the matrix `runs` times.
pub async fn measure(args: &BenchArgs, shutdown: &CancellationToken) -> anyhow::Result<Matrix> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let registry = prometheus::Registry::new();
    let shared = match args.store.kind {
        StoreKind::Memory => None,
        StoreKind::Cosmos => Some(
            args.store
                .open(clock.clone(), args.replication_bound, &registry)
                .await
                .map_err(OpenStoreError::into_anyhow)?,
        ),
    };
    let tag = format!("{:x}", rand::random::<u32>());
    let mut matrix = Matrix::default();
    for run in 0..args.runs {
        for &fraction in &args.fractions {
            for &design in &args.designs {
                if shutdown.is_cancelled() {
                    anyhow::bail!("interrupted");
                }
                let store: Arc<dyn LocationStore> = match &shared {
                    Some(store) => store.clone(),
                    None => {
                        let memory = MemoryStore::new(
                            clock.clone(),
                            MemoryStoreConfig { replica_lag: args.replication_bound, ..MemoryStoreConfig::default() },
                        );
                        Arc::new(LatencyStore::new(Arc::new(memory), args.latency_model()))
                    }
                };
                let prefix = format!("bench-{tag}-{run}-{design}-{}-", (fraction * 1e6).round() as u64);
                let spec = args.spec(design, fraction, prefix);
                let result = load::run(&spec, store)
                    .await
                    .with_context(|| format!("run {run}, {design} at {}", percent(fraction)))?;
                eprintln!(
                    "lockprobe bench: run {} of {}: {design} at {}: {} ops, {:.4} lock reads/op",
                    run + 1,
                    args.runs,
                    percent(fraction),
                    result.user_ops,
                    Figures::of(&result).lock_reads_per_op
                );
                matrix.push(fraction, design, result);
            }
        }
    }
    Ok(matrix)
}

/// The report as JSON.
pub fn report_json(args: &BenchArgs, matrix: &Matrix) -> Value {
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    for &fraction in &args.fractions {
        for &design in &args.designs {
            if let Some(figures) = matrix.median_figures(fraction, design) {
                let sizes = matrix.document_sizes(fraction, design).unwrap_or_default();
                rows.push(json!({"fraction": fraction, "design": design, "median": figures, "documentSizes": sizes}));
            }
        }
        if let Some(r) = matrix.median_ratios(fraction) {
            ratios.push(json!({"fraction": fraction, "median": r}));
        }
    }
    json!({
        "settings": settings(args),
        "results": rows,
        "ratios": ratios,
    })
}

fn settings(args: &BenchArgs) -> Value {
    let d = |d: Duration| humantime::format_duration(d).to_string();
    let range = |(low, high): (Duration, Duration)| format!("{}..{}", d(low), d(high));
    json!({
        "store": match args.store.kind { StoreKind::Memory => "memory", StoreKind::Cosmos => "cosmos" },
        "runs": args.runs,
        "resources": args.resources,
        "instances": args.instances,
        "ratePerInstance": args.rate,
        "duration": d(args.duration),
        "warmup": d(args.warmup),
        "cacheTtl": d(args.cache_ttl),
        "replicationBound": d(args.replication_bound),
        "phaseHold": d(args.phase_hold),
        "replicaReadLatency": range(args.replica_read_latency),
        "writeRegionReadLatency": range(args.write_region_read_latency),
        "writeLatency": range(args.write_latency),
        "writeRegionRtt": d(args.write_region_rtt),
    })
}

/// The report as a text table.
pub fn report_text(args: &BenchArgs, matrix: &Matrix) -> String {
    let mut out = format!(
        "lockprobe bench: {} instances x {} ops/s, {} resources, {} measured after {} warm-up, medians of {} run(s), store {}\n",
        args.instances,
        args.rate,
        args.resources,
        humantime::format_duration(args.duration),
        humantime::format_duration(args.warmup),
        args.runs,
        settings(args)["store"].as_str().unwrap_or("?"),
    );
    out.push_str(&format!(
        "{:<7} {:<9} {:>9} {:>11} {:>13} {:>12} {:>8} {:>8} {:>8} {:>10} {:>8} {:>6} {:>6}\n",
        "f",
        "design",
        "ops/s",
        "lock rd/op",
        "(record|r-t)",
        "route rd/op",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "ops/CPU-s",
        "blocked",
        "errors",
        "migr."
    ));
    for &fraction in &args.fractions {
        for &design in &args.designs {
            let Some(f) = matrix.median_figures(fraction, design) else { continue };
            out.push_str(&format!(
                "{:<7} {:<9} {:>9.0} {:>11.5} {:>6.4}|{:<6.4} {:>12.4} {:>8.3} {:>8.3} {:>8.3} {:>10.0} {:>7.2}% {:>6} {:>6}\n",
                percent(fraction),
                design.as_str(),
                f.ops_per_second,
                f.lock_reads_per_op,
                f.lock_record_reads_per_op,
                f.routing_write_region_reads_per_op,
                f.routing_reads_per_op,
                f.p50_ms,
                f.p99_ms,
                f.p999_ms,
                f.ops_per_cpu_second,
                f.blocked_share * 100.0,
                f.errors,
                f.migrations
            ));
        }
        if let Some(r) = matrix.median_ratios(fraction) {
            out.push_str(&format!(
                "{:<7} ratio     lock reads record/embedded {}{:.0}x; p99 embedded/record {:.3}; ops/CPU-s embedded/record {:.2}\n",
                percent(fraction),
                if r.lock_reads_lower_bound { ">= " } else { "" },
                r.lock_reads,
                r.p99,
                r.ops_per_cpu_second
            ));
        }
    }
    out.push_str(
        "document sizes: bytes as stored of every version the lock calls wrote (record: lock records and routing \
         moves), by lock phase; largest over the runs\n",
    );
    out.push_str(&format!(
        "{:<7} {:<9} {:<11} {:>9} {:>7} {:>7} {:>7}\n",
        "f", "design", "phase", "versions", "p50 B", "p99 B", "max B"
    ));
    for &fraction in &args.fractions {
        for &design in &args.designs {
            let Some(sizes) = matrix.document_sizes(fraction, design) else { continue };
            for r in &sizes.rows {
                out.push_str(&format!(
                    "{:<7} {:<9} {:<11} {:>9} {:>7} {:>7} {:>7}\n",
                    percent(fraction),
                    design.as_str(),
                    r.phase,
                    r.versions,
                    r.p50,
                    r.p99,
                    r.max
                ));
            }
            for over in sizes.over_budget() {
                out.push_str(&format!("{:<7} {:<9} OVER BUDGET: {over}\n", percent(fraction), design.as_str()));
            }
        }
    }
    out
}

/// Runs `lockprobe bench`.
pub async fn run(args: BenchArgs, shutdown: CancellationToken) -> anyhow::Result<u8> {
    args.validate()?;
    args.store.validate().map_err(|e| UsageError::new(e.to_string()))?;
    let matrix = measure(&args, &shutdown).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report_json(&args, &matrix))?);
    } else {
        print!("{}", report_text(&args, &matrix));
    }
    Ok(0)
}
