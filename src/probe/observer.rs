//! Who hears about a cycle while it runs: people (`validate`, `demo` print progress lines)
//! or logs (`serve`).

use std::io::Write;

use super::report::Assertion;

/// Receives progress of a running cycle.
pub trait Observer: Send + Sync {
    /// A step begins (`pre-lock probe-0001`, `waiting 2.0s for convergence`).
    fn step(&self, target: &str, check: &str, message: &str);
    /// An assertion was decided.
    fn assertion(&self, target: &str, assertion: &Assertion);
}

/// Prints readable progress lines to stdout.
#[derive(Debug, Default)]
pub struct PrintObserver;

impl Observer for PrintObserver {
    fn step(&self, target: &str, check: &str, message: &str) {
        let mut out = std::io::stdout().lock();
        // A closed stdout must not stop the probe; progress is best effort.
        let _ = writeln!(out, "[{target}] {check}: {message}");
    }

    fn assertion(&self, target: &str, assertion: &Assertion) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "[{target}]   {}", assertion.line());
    }
}

/// Sends progress to `tracing` (steps at debug, failed assertions at warn).
#[derive(Debug, Default)]
pub struct TracingObserver;

impl Observer for TracingObserver {
    fn step(&self, target: &str, check: &str, message: &str) {
        tracing::debug!(target_name = %target, check, "{message}");
    }

    fn assertion(&self, target: &str, a: &Assertion) {
        if a.passed {
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
