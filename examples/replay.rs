//! A paper-scale day: 10 million migrations through the routing library and the
//! convergence monitor on the memory store, in compressed time (`harness::replay`).
//!
//! ```text
//! cargo run --release --example replay -- --migrations 10000000
//! ```
//!
//! Prints what the monitor saw, the wall time, events (changes the monitor applied)
//! per second, the monitor's peak timelines and its own estimate of their heap, and
//! the process's peak RSS, and the size of the documents the lock calls wrote per lock
//! phase (p50, p99, max; `--no-document-sizes` leaves that count out, to time it). Exits
//! 1 if any migration failed, the monitor found an anomaly, or the sizes broke contract
//! 1.3's budget (p99 over 4 KiB, a version over 100 KiB). Figures are in BENCHMARKS.md.

use std::time::Duration;

use clap::Parser;

use lockprobe::harness::replay::{self, ReplayConfig};

/// The replay allocates and frees a few dozen small strings and maps per lock call
/// (documents cloned, settled, written, read back); mimalloc's thread-local free lists
/// take that churn for much less than glibc's malloc (BENCHMARKS.md has the figures).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Replays a day of migrations in compressed time.
#[derive(Debug, Parser)]
struct Args {
    /// Migrations started over the day.
    #[arg(long, default_value_t = 10_000_000)]
    migrations: u64,
    /// Virtual length of the day.
    #[arg(long, default_value = "24h", value_parser = lockprobe::duration::parse_bounded_duration)]
    day: Duration,
    /// Service instances (routing clients, each with its own cache).
    #[arg(long, default_value_t = 2)]
    instances: usize,
    /// Threads making the migrations' steps and the monitor's polls.
    #[arg(long, default_value_t = 2)]
    drivers: usize,
    /// Every n-th migration is released instead of swapped (0: none).
    #[arg(long, default_value_t = 100)]
    release_every: u64,
    /// Most changes the monitor may fall behind before the drivers wait for it.
    #[arg(long, default_value_t = ReplayConfig::default().max_monitor_lag)]
    max_monitor_lag: usize,
    /// Do not count the size of the documents written (to measure what counting costs).
    #[arg(long)]
    no_document_sizes: bool,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.migrations == 0
        || args.instances == 0
        || args.drivers == 0
        || args.day.is_zero()
        || args.max_monitor_lag == 0
    {
        eprintln!("replay: --migrations, --instances, --drivers, --day and --max-monitor-lag must be positive");
        return std::process::ExitCode::from(64);
    }
    let config = ReplayConfig {
        migrations: args.migrations,
        day: args.day,
        instances: args.instances,
        drivers: args.drivers,
        release_every: args.release_every,
        max_monitor_lag: args.max_monitor_lag,
        document_sizes: !args.no_document_sizes,
        ..ReplayConfig::default()
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    let r = match runtime.block_on(replay::run(config)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("replay: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let secs = r.wall.as_secs_f64();
    println!("migrations          {}", r.migrations);
    println!("wall                {secs:.1} s  (virtual {:.0} s)", r.virtual_span.as_secs_f64());
    println!("migrations/s        {:.0}", r.migrations as f64 / secs);
    println!("monitor events      {}  ({:.0}/s)", r.changes, r.events_per_second());
    println!("lock calls          {}  resolves {}", r.lock_calls, r.resolves);
    println!(
        "store calls         reads {} (write region {}, replica {}), writes {}, change reads {}",
        r.store.reads(),
        r.store.read_write_region,
        r.store.read_replica,
        r.store.writes(),
        r.store.read_changes
    );
    println!("outcomes            swapped {}  released {}  lapsed {}", r.swapped, r.released, r.lapsed);
    println!(
        "anomalies           early escalations {}  partial cutovers {}  orphans {}  in flight at end {}",
        r.early_escalations, r.partial_cutovers, r.orphaned_locks, r.in_flight_at_end
    );
    println!(
        "monitor peak        {} in flight, {} timelines, ~{:.1} MiB (its own estimate)",
        r.peak_in_flight,
        r.peak_timelines,
        r.peak_monitor_bytes as f64 / 1048576.0
    );
    println!("store peak          {} documents", r.peak_documents);
    if let Some(kib) = lockprobe::harness::peak_rss_bytes().map(|b| b / 1024) {
        println!("peak RSS            {:.1} MiB (whole process)", kib as f64 / 1024.0);
    }
    let over_budget = r.document_sizes.over_budget();
    if args.no_document_sizes {
        println!("document sizes      not counted (--no-document-sizes)");
    } else {
        println!("document sizes      bytes as stored, of every version the lock calls wrote, by lock phase");
        print!("{}", r.document_sizes.text("  "));
        for over in &over_budget {
            println!("  OVER BUDGET: {over}");
        }
    }
    println!("failures            {}", r.failures);
    for f in &r.first_failures {
        println!("  {f}");
    }
    let clean = r.failures == 0
        && r.swapped + r.released == r.migrations
        && r.lapsed == 0
        && r.early_escalations == 0
        && r.partial_cutovers == 0
        && r.orphaned_locks == 0
        && over_budget.is_empty();
    if clean {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
