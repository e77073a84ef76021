//! Who hears about a cycle while it runs: people (`validate`, `demo` print progress lines)
//! or logs (`serve`).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;

use super::report::{Assertion, CycleReport};

/// Receives progress of a running cycle.
pub trait Observer: Send + Sync {
    /// A step begins (`pre-lock probe-0001`, `waiting 2.0s for convergence`).
    fn step(&self, target: &str, check: &str, message: &str);
    /// An assertion was decided.
    fn assertion(&self, target: &str, assertion: &Assertion);
    /// A check of a cycle finished (the negative checks run side by side).
    fn check_finished(&self, _target: &str, _check: &str) {}
    /// A cycle finished with `report`.
    fn cycle_finished(&self, _report: &CycleReport) {}
}

/// Prints readable progress lines to stdout. The negative checks run side by side: their
/// lines are held back and printed together, one check after the other, as each ends.
/// After each cycle, a short summary.
#[derive(Debug, Default)]
pub struct PrintObserver {
    held: Mutex<HashMap<(String, String), Vec<String>>>,
}

impl PrintObserver {
    /// Prints `line`, or holds it until `check` finishes when checks run side by side.
    fn emit(&self, target: &str, check: &str, line: String) {
        if check.starts_with("negative/") {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.entry((target.to_owned(), check.to_owned())).or_default().push(line);
            return;
        }
        let mut out = std::io::stdout().lock();
        // A closed stdout must not stop the probe; progress is best effort.
        let _ = writeln!(out, "{line}");
    }
}

impl Observer for PrintObserver {
    fn step(&self, target: &str, check: &str, message: &str) {
        self.emit(target, check, format!("[{target}] {check}: {message}"));
    }

    fn assertion(&self, target: &str, assertion: &Assertion) {
        self.emit(target, &assertion.check, format!("[{target}]   {}", assertion.line()));
    }

    fn check_finished(&self, target: &str, check: &str) {
        let lines = self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&(target.to_owned(), check.to_owned()));
        let mut out = std::io::stdout().lock();
        for line in lines.unwrap_or_default() {
            let _ = writeln!(out, "{line}");
        }
    }

    fn cycle_finished(&self, report: &CycleReport) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "[{}] summary: {}", report.target, summary(report));
    }
}

/// One line about a cycle: how long each phase was held (by the service's timestamps),
/// the write phase's read-throughs (the service's store time and the probe's own
/// measurement, p50 / p99) and each instance's convergence.
pub fn summary(r: &CycleReport) -> String {
    let holds: Vec<String> = r.phase_durations.iter().map(|(p, s)| format!("{p} {}", secs(*s))).collect();
    let holds = if holds.is_empty() { "none".to_owned() } else { holds.join(", ") };
    let rt = |values: &[f64]| match (nearest_rank(values, 0.5), nearest_rank(values, 0.99)) {
        (Some(p50), Some(p99)) => format!("p50 {} / p99 {}", secs(p50), secs(p99)),
        _ => "none".to_owned(),
    };
    let convergence: Vec<String> = r
        .observed_convergence
        .iter()
        .enumerate()
        .map(|(i, c)| match c.observed_seconds {
            Some(s) => format!("#{i} {}", secs(s)),
            None => format!("#{i} not within {}", secs(c.bound_seconds)),
        })
        .collect();
    let declared = r.declared_convergence_seconds.map(secs).unwrap_or_else(|| "?".to_owned());
    format!(
        "held {holds}; read-through store {} (measured {}); convergence {} (declared {declared})",
        rt(&r.read_through_seconds),
        rt(&r.read_through_client_seconds),
        if convergence.is_empty() { "none".to_owned() } else { convergence.join(", ") },
    )
}

/// Seconds for people: milliseconds below one second.
fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1}ms", s * 1000.0)
    } else {
        format!("{s:.2}s")
    }
}

/// The nearest-rank `q` quantile of `values` (a cycle has a handful of them).
fn nearest_rank(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
    sorted.get(rank - 1).copied()
}

/// Sends progress to `tracing` (steps at debug, failed assertions at warn).
#[derive(Debug, Default)]
pub struct TracingObserver;

impl Observer for TracingObserver {
    fn step(&self, target: &str, check: &str, message: &str) {
        tracing::debug!(target_name = %target, check, "{message}");
    }

    fn assertion(&self, target: &str, a: &Assertion) {
        if let Some(why) = &a.inconclusive {
            tracing::info!(target_name = %target, check = %a.check, phase = %a.phase, op = %a.op, reason = %why, "assertion inconclusive");
        } else if a.passed {
            tracing::debug!(target_name = %target, check = %a.check, phase = %a.phase, op = %a.op, "assertion passed");
        } else {
            tracing::warn!(
                target_name = %target,
                check = %a.check,
                phase = %a.phase,
                op = %a.op,
                instance = a.instance.as_deref().unwrap_or("-"),
                expected = %a.expected,
                observed = %a.observed,
                "assertion failed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        assert_eq!(nearest_rank(&[], 0.5), None);
        assert_eq!(nearest_rank(&[3.0, 1.0, 2.0], 0.5), Some(2.0));
        assert_eq!(nearest_rank(&[3.0, 1.0, 2.0], 0.99), Some(3.0));
        assert_eq!(nearest_rank(&[0.25], 0.99), Some(0.25));
    }

    #[test]
    fn negative_check_lines_are_held_until_the_check_ends() {
        let o = PrintObserver::default();
        o.step("t", "negative/wrong-token", "a");
        o.step("t", "negative/second-pre-lock", "b");
        o.step("t", "cycle", "printed at once");
        assert_eq!(o.held.lock().unwrap().len(), 2);
        o.check_finished("t", "negative/wrong-token");
        assert_eq!(o.held.lock().unwrap().len(), 1);
    }
}
