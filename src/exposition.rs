//! Prometheus text exposition: the one way a registry is rendered, and the one
//! `GET /metrics` route (the probe's server, `lockprobe monitor` and the reference
//! service all mount it).
//!
//! Also what the probe and the monitor must agree on without knowing each other: the
//! histogram buckets of lock phases and read-through, and `lockprobe_build_info` with
//! the process metrics.

use std::time::Duration;

use axum::http::header;
use axum::routing::{get, MethodRouter};
use prometheus::{Encoder, Registry, TextEncoder};

use crate::versions;

/// Where the metrics are served.
pub const PATH: &str = "/metrics";

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets for lock phase holds, shared by the probe and the monitor so their
/// histograms compare bucket for bucket: seconds-long test phases up to three-day
/// pre-locks, and every 2.5 s from 10 to 30 s, where the paper's production write lock
/// sits (13 s p50, 19 s p99), so its p50 and p99 are told apart.
pub const PHASE_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 17.5, 20.0, 22.5, 25.0, 27.5, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0, 7200.0, 14400.0, 21600.0, 43200.0, 86400.0, 172800.0, 259200.0,
];

/// Buckets for serialized routing-document sizes, bytes, shared by the monitor's
/// `lockprobe_monitor_document_bytes` and the service's `lockprobe_service_document_bytes`
/// so the two views compare bucket for bucket: around the contract's 4 KiB budget at
/// p99 and up to Cosmos DB's 2 MB item limit.
pub const DOCUMENT_BYTES_BUCKETS: &[f64] = &[
    256.0, 512.0, 1024.0, 2048.0, 3072.0, 4096.0, 6144.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0, 524288.0,
    2097152.0,
];

/// Buckets for read-through latency: sub-millisecond (the demo) to seconds, with
/// 40 / 50 / 60 / 75 ms around the paper's production p99 of about 50 ms.
pub const READ_THROUGH_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.04, 0.05, 0.06, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5];

/// Registers what every lockprobe process exports about itself on `registry`:
/// `lockprobe_build_info{version, contract, formats_read, newest_format}` (always 1;
/// the crate's version, no git metadata, so a build from a tarball says the same; the
/// contract version its service speaks and the document formats its library reads
/// and writes, [`crate::versions`]) and, on Linux, the standard
/// `process_*` metrics (CPU, resident memory, open file descriptors, start time).
pub fn register_process_metrics(registry: &Registry) -> Result<(), prometheus::Error> {
    let info = prometheus::IntGaugeVec::new(
        prometheus::Opts::new(
            "lockprobe_build_info",
            "The running lockprobe's version, contract version and document formats; always 1.",
        ),
        &["version", "contract", "formats_read", "newest_format"],
    )?;
    let newest = versions::NEWEST_FORMAT.to_string();
    info.with_label_values(&[
        versions::LIBRARY_VERSION,
        versions::CONTRACT_VERSION,
        &versions::formats_read(),
        &newest,
    ])
    .set(1);
    registry.register(Box::new(info))?;
    #[cfg(target_os = "linux")]
    registry.register(Box::new(ProcessMetrics(prometheus::process_collector::ProcessCollector::for_self())))?;
    Ok(())
}

/// The standard `process_*` metrics of the prometheus crate's collector, except its CPU
/// time: it counts whole seconds, truncated, so a process that used 0.5 s of CPU showed
/// 0. `process_cpu_seconds_total` is taken from [`process_cpu_time`] instead, to the
/// nanosecond.
#[cfg(target_os = "linux")]
struct ProcessMetrics(prometheus::process_collector::ProcessCollector);

#[cfg(target_os = "linux")]
impl prometheus::core::Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families = self.0.collect();
        let seconds = process_cpu_time().as_secs_f64();
        for family in families.iter_mut().filter(|f| f.name() == "process_cpu_seconds_total") {
            for metric in family.mut_metric() {
                let mut counter = prometheus::proto::Counter::default();
                counter.set_value(seconds);
                metric.set_counter(counter);
            }
        }
        families
    }
}

/// CPU time (user + system, every thread) this process has used so far, to the
/// nanosecond; zero where the clock cannot be read. What `process_cpu_seconds_total`
/// exports, and what the harnesses measure their runs by.
pub fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// Every metric of `registry` in the text exposition format.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec only fails on invalid metric families, which registration
    // rules out.
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut buf) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// `GET` handler serving `registry` (mount it at [`PATH`]).
pub fn route<S: Clone + Send + Sync + 'static>(registry: Registry) -> MethodRouter<S> {
    get(move || {
        let text = render(&registry);
        async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], text) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    #[tokio::test]
    async fn serves_the_registry_as_text() {
        let registry = Registry::new();
        let c = prometheus::IntCounter::new("lockprobe_test_total", "A test counter.").unwrap();
        registry.register(Box::new(c.clone())).unwrap();
        c.inc();
        let app = axum::Router::new().route(PATH, route(registry));
        let r = app.oneshot(Request::get(PATH).body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(r.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains("lockprobe_test_total 1"));
    }

    /// `process_cpu_seconds_total` to the nanosecond: the prometheus crate's own counts
    /// whole seconds, so a process that has used under a second shows 0.
    #[cfg(target_os = "linux")]
    #[test]
    fn cpu_time_is_exported_with_its_fraction() {
        let registry = Registry::new();
        register_process_metrics(&registry).unwrap();
        let spin_until = std::time::Instant::now() + std::time::Duration::from_millis(20);
        while std::time::Instant::now() < spin_until {
            std::hint::black_box(0u64);
        }
        let before = process_cpu_time().as_secs_f64();
        let text = render(&registry);
        let after = process_cpu_time().as_secs_f64();
        let line = text.lines().find(|l| l.starts_with("process_cpu_seconds_total ")).expect("exported");
        let exported: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((before..=after).contains(&exported), "{exported} not within [{before}, {after}]");
        assert!(exported > 0.0 && exported.fract() != 0.0, "{line}");
        assert!(text.contains("process_resident_memory_bytes "), "the other process metrics stay");
    }
}
