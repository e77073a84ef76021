use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};

use super::*;

/// Instants on both clocks, counted from one base: the wall clock as far from its base
/// as the monotonic clock, unless a test makes it step.
struct Clocks {
    mono: Instant,
    wall: DateTime<Utc>,
}

impl Clocks {
    fn new() -> Self {
        Self { mono: Instant::now(), wall: DateTime::parse_from_rfc3339("2026-12-03T12:00:00Z").unwrap().to_utc() }
    }

    /// `secs` after the base on the monotonic clock, `secs + step` on the wall clock.
    fn at(&self, secs: f64, step: f64) -> Stamp {
        Stamp {
            mono: self.mono + Duration::from_secs_f64(secs),
            wall: self.wall + TimeDelta::microseconds(((secs + step) * 1e6) as i64),
        }
    }

    fn window(&self, sent: f64, answered: f64) -> Window {
        Window { sent: self.at(sent, 0.0), answered: self.at(answered, 0.0) }
    }

    /// A window during which the wall clock has stepped by `step` since the base.
    fn stepped(&self, sent: f64, answered: f64, step: f64) -> Window {
        Window { sent: self.at(sent, step), answered: self.at(answered, step) }
    }
}

/// A 2 s lease granted by a call sent at 0 and answered 20 ms later.
fn lease(c: &Clocks) -> Lease {
    Lease::granted(c.window(0.0, 0.020), Duration::from_secs(2))
}

#[test]
fn an_operation_inside_the_lease_on_both_clocks_is_held_to_it() {
    let c = Clocks::new();
    assert_eq!(lease(&c).held_over(&c.window(0.5, 1.99)), Held::Certainly);
}

#[test]
fn an_operation_sent_before_the_grant_was_answered_is_not() {
    let c = Clocks::new();
    let Held::Uncertain(why) = lease(&c).held_over(&c.window(0.010, 0.5)) else { panic!("held") };
    assert!(why.contains("before the lock call that grants the lease was answered"), "{why}");
}

#[test]
fn an_operation_whose_window_meets_the_span_in_which_the_lease_ends_is_inconclusive() {
    let c = Clocks::new();
    // Answered after the earliest end (2.000), sent before the latest (2.020).
    let Held::Uncertain(why) = lease(&c).held_over(&c.window(1.99, 2.001)) else { panic!("decided") };
    assert!(why.contains("sent -0.010s and answered +0.001s from the lease's earliest end"), "{why}");
    assert!(why.contains("ends within 0.020s"), "{why}");
    // Sent inside that span: still not certainly after it.
    assert!(matches!(lease(&c).held_over(&c.window(2.01, 2.03)), Held::Uncertain(_)));
}

#[test]
fn an_operation_sent_after_the_latest_end_is_after_the_lease() {
    let c = Clocks::new();
    assert_eq!(lease(&c).held_over(&c.window(2.020, 2.05)), Held::Over);
}

#[test]
fn a_forward_step_of_the_wall_clock_makes_an_operation_inside_the_lease_by_the_monotonic_clock_inconclusive() {
    // The shipped library's failed gate run: a write sent 0.493 s before the lease's end
    // by the monotonic clock, accepted, while the wall clock the service counts the
    // lease on had stepped past the end.
    let c = Clocks::new();
    let op = c.stepped(1.507, 1.52, 1.2);
    let Held::Uncertain(why) = lease(&c).held_over(&op) else { panic!("held to the lease") };
    assert!(why.contains("the wall clock moved +1.200s against the monotonic clock"), "{why}");
    // Without the step the same window is held to the lease.
    assert_eq!(lease(&c).held_over(&c.window(1.507, 1.52)), Held::Certainly);
}

#[test]
fn a_backward_step_never_makes_an_operation_look_after_the_lease() {
    let c = Clocks::new();
    let op = c.stepped(2.5, 2.6, -1.0);
    let Held::Uncertain(why) = lease(&c).held_over(&op) else { panic!("over") };
    assert!(why.contains("moved -1.000s"), "{why}");
}

#[test]
fn a_lapse_is_certain_only_past_the_latest_end_and_the_enforcement_the_service_announced() {
    let c = Clocks::new();
    let beyond = Duration::from_millis(500);
    assert_eq!(lease(&c).over_when_sent(&c.window(2.520, 2.6), beyond), Held::Over);
    let Held::Uncertain(why) = lease(&c).over_when_sent(&c.window(2.3, 2.4), beyond) else { panic!("over") };
    assert!(why.contains("+0.500s the service may still enforce it"), "{why}");
    assert!(matches!(lease(&c).over_when_sent(&c.stepped(2.6, 2.7, -0.5), beyond), Held::Uncertain(_)));
}

#[test]
fn a_wall_step_is_measured_against_the_monotonic_clock() {
    let c = Clocks::new();
    let step = c.at(5.0, 0.75).wall_step_since(&c.at(1.0, 0.0));
    assert_eq!(step, TimeDelta::milliseconds(750));
    assert_eq!(c.at(5.0, 0.0).wall_step_since(&c.at(1.0, 0.0)), TimeDelta::zero());
}

#[test]
fn a_tally_counts_what_was_held_and_keeps_a_few_distinct_reasons() {
    let mut t = Tally::default();
    assert_eq!(t.share(), 0.0);
    for _ in 0..3 {
        t.count_held();
    }
    t.count_inconclusive("a".into());
    assert_eq!(t.share(), 0.25);
    for r in ["a", "b", "c", "d", "e"] {
        t.count_inconclusive(r.into());
    }
    assert_eq!(t.inconclusive, 6);
    assert_eq!(t.reasons, ["a", "b", "c"]);
}
