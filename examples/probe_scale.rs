//! The probe engine at scale: 1,000 targets' cycles at once in one probe process
//! against in-process reference services (`harness::probe_scale`).
//!
//! ```text
//! cargo run --release --example probe_scale -- --targets 1000
//! ```
//!
//! Prints the scheduler's lateness (p50/p99/max over every wake-up), the cycles' start
//! delay (firing time to running, cap and runtime queue included), cycles run and
//! passed, the most cycles that overlapped, and the process's CPU time per cycle and
//! resident memory per concurrent cycle. Exits 1 if a judged cycle did not pass.

use std::time::Duration;

use clap::Parser;

use lockprobe::harness::probe_scale::{self, ScaleConfig};

/// Runs many probe targets at once.
#[derive(Debug, Parser)]
struct Args {
    /// Targets, each with its own test prefix and pool.
    #[arg(long, default_value_t = 1000)]
    targets: usize,
    /// Reference services the targets are spread over (two instances each).
    #[arg(long, default_value_t = 4)]
    services: usize,
    /// Cycles judged per target.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Every target's schedule (cron, seconds first).
    #[arg(long, default_value = "*/10 * * * * *")]
    schedule: String,
    /// Random delay after each firing, up to this.
    #[arg(long, default_value = "2s", value_parser = lockprobe::duration::parse_bounded_duration)]
    jitter: Duration,
    /// The probe's cap on cycles running at once (`max_concurrent_cycles`).
    #[arg(long, default_value_t = lockprobe::probe::DEFAULT_MAX_CONCURRENT_CYCLES)]
    max_concurrent_cycles: usize,
    /// Worker threads of the runtime.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

fn secs(x: Option<f64>) -> String {
    x.map_or("-".into(), |s| format!("{:.1} ms", s * 1000.0))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.targets == 0
        || args.services == 0
        || args.rounds == 0
        || args.threads == 0
        || args.max_concurrent_cycles == 0
    {
        eprintln!(
            "probe_scale: --targets, --services, --rounds, --threads and --max-concurrent-cycles must be positive"
        );
        return std::process::ExitCode::from(64);
    }
    let config = ScaleConfig {
        targets: args.targets,
        services: args.services,
        rounds: args.rounds,
        schedule: args.schedule,
        jitter: args.jitter,
        max_concurrent_cycles: args.max_concurrent_cycles,
        ..ScaleConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let r = match runtime.block_on(probe_scale::run(config)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("probe_scale: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("targets run         {} of {}", r.targets_run, args.targets);
    println!(
        "cycles judged       {} ({} passed); {} more not judged (later cycles, or cancelled at the stop)",
        r.cycles, r.passed, r.cycles_not_judged
    );
    println!(
        "scheduler lateness  p50 {}  p99 {}  max {}  ({} wake-ups)",
        secs(r.lateness.p50),
        secs(r.lateness.p99),
        secs(r.lateness.max),
        r.lateness.count
    );
    println!(
        "cycle start delay   p50 {}  p99 {}  max {}  ({} cycles; {} held back by the cap)",
        secs(r.start_delay.p50),
        secs(r.start_delay.p99),
        secs(r.start_delay.max),
        r.start_delay.count,
        r.held_back
    );
    println!("peak concurrent     {} cycles; median cycle {:.1} s", r.peak_concurrent, r.cycle_p50.as_secs_f64());
    println!("wall                {:.1} s", r.wall.as_secs_f64());
    println!(
        "cpu                 {:.1} s, {:.1} ms per cycle (whole process)",
        r.cpu.as_secs_f64(),
        r.cpu_per_cycle().as_secs_f64() * 1000.0
    );
    println!(
        "rss                 {:.1} MiB before, {:.1} MiB peak, {:.1} KiB per concurrent cycle (whole process)",
        r.rss_before as f64 / 1048576.0,
        r.rss_peak as f64 / 1048576.0,
        r.rss_per_concurrent_cycle() as f64 / 1024.0
    );
    for line in &r.not_passed {
        println!("  not passed: {line}");
    }
    if r.passed == r.cycles && r.targets_run == args.targets {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
