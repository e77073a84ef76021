//! Decision windows against the real reference service: the release gate's one failure
//! of the shipped library, reproduced deterministically.
//!
//! A service counts leases on its wall clock; the probe measured the eager renewal's
//! lease on its monotonic clock. When the wall clock of the machine they share steps
//! forward, the service honestly ends the lease early, by the clock it counts on, and
//! accepts writes the probe held to the lease: `write/write expected block, observed
//! allow - a write sent -0.49s from the lease's first end was accepted; the renewal says
//! lapsed first (410)`. The probe now holds an operation to a lease only where both of
//! its clocks agree that the lease was in force, so the same run reports those writes
//! as inconclusive, naming the step, and the check fails as `inconclusive` (it decided
//! nothing), never as an enforcement violation.

#[path = "support/service.rs"]
mod service;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use lockprobe::clock::Clock;
use lockprobe::probe::Op;
use lockprobe::probe::TracingObserver;
use lockprobe::probe::RESOURCES_PER_CYCLE;
use lockprobe::probe::{validate, ValidateOptions};
use tokio_util::sync::CancellationToken;

/// The system's wall clock, moved by however far the test stepped it.
#[derive(Debug, Default)]
struct SteppingClock {
    offset_ns: AtomicI64,
}

impl SteppingClock {
    fn step(&self, by: Duration) {
        self.offset_ns.fetch_add(by.as_nanos() as i64, Ordering::SeqCst);
    }
}

impl Clock for SteppingClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + TimeDelta::nanoseconds(self.offset_ns.load(Ordering::SeqCst))
    }
}

/// How far the wall clock steps, and how long after the renewal check's write lock was
/// granted: well inside its 2 s lease, before its writers start.
const STEP: Duration = Duration::from_millis(1500);
const STEP_AFTER: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_step_during_the_eager_renewal_is_inconclusive_not_an_enforcement_violation() {
    let clock = Arc::new(SteppingClock::default());
    let svc =
        service::start_service_on_clock(clock.clone(), Duration::from_millis(500), Duration::from_millis(200)).await;
    let opts = ValidateOptions {
        endpoints: svc.urls.clone(),
        api_key: svc.key.clone(),
        test_prefix: "probe-".into(),
        buffer: Duration::from_millis(300),
        eager: true,
        run_id: Some("step".into()),
        clock: clock.clone(),
        ..ValidateOptions::default()
    };
    // The eager checks' resources follow the negative checks'; the renewal's is last.
    let renewal = opts.resources("step")[RESOURCES_PER_CYCLE + 1].clone();
    let url = svc.urls[0].clone();
    let stepper = tokio::spawn({
        let clock = clock.clone();
        async move {
            loop {
                let view = service::route(&url, &renewal).await;
                if view["lock"]["phase"] == "write" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(STEP_AFTER).await;
            clock.step(STEP);
        }
    });
    let report = validate(&opts, Arc::new(TracingObserver), CancellationToken::new()).await.expect("the cycle runs");
    stepper.await.expect("the wall clock stepped during the renewal check");

    let check = |a: &&lockprobe::probe::Assertion| a.check == "eager/renewal";
    let renewal: Vec<_> = report.assertions.iter().filter(check).collect();
    let lines: Vec<String> = renewal.iter().map(|a| a.line()).collect();
    // Nothing in the check is an enforcement violation: the writes the service accepted
    // after its lease ended by its stepped clock are not held to the lease.
    assert!(renewal.iter().all(|a| !a.is_enforcement_violation()), "{lines:#?}");
    let decisions =
        report.decisions.iter().find(|d| d.check == "eager/renewal").expect("the renewal check's decisions");
    assert!(decisions.inconclusive > 0, "{decisions:?}");
    assert!(
        decisions.reasons.iter().any(|r| r.contains("the wall clock moved +1.5")),
        "the step is named: {decisions:?}"
    );
    let inconclusive: Vec<_> = renewal.iter().filter(|a| a.inconclusive.is_some()).collect();
    assert!(!inconclusive.is_empty() && inconclusive.iter().all(|a| a.op == Op::Write), "{lines:#?}");
    // It decided (next to) nothing, so it fails as inconclusive, not as passed.
    let decided = renewal.iter().find(|a| a.op == Op::Decided).expect("the check's decided assertion");
    assert!(decided.failed() && decided.observed.as_str() == "inconclusive", "{lines:#?}");
    // The report says why in words a release engineer reads.
    assert!(report.to_junit(&svc.urls).contains("inconclusive: the wall clock moved +1.5"), "{lines:#?}");
}
