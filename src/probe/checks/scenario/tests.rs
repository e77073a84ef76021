//! Unit tests of the outcome vocabulary.

use super::check::classify;
use super::negative::Negative;
use super::walk::route_summary;
use crate::probe::checks::target::Reply;
use crate::probe::checks::vocabulary::{Outcome, UserOp};
use serde_json::{json, Value};
use std::time::Duration;

fn reply(status: u16, body: Value, retry_after: Option<&str>) -> Reply {
    Reply {
        status,
        problem: (status >= 400)
            .then(|| body["type"].as_str().unwrap_or("x").trim_start_matches("urn:lockprobe:error:").to_string()),
        body,
        retry_after: retry_after.map(str::to_string),
        timing: None,
        store_region: None,
        elapsed: Duration::ZERO,
    }
}

#[test]
fn classify_follows_the_enforcement_table() {
    assert_eq!(classify(UserOp::Read, &reply(200, json!({"tombstone": false}), None)), Outcome::Allow);
    assert_eq!(classify(UserOp::Read, &reply(200, json!({"tombstone": true}), None)), Outcome::Tombstone);
    assert_eq!(classify(UserOp::Read, &reply(404, json!({}), None)), Outcome::Absent);
    assert_eq!(classify(UserOp::Write, &reply(201, json!({}), None)), Outcome::Allow);
    assert_eq!(
        classify(UserOp::Write, &reply(423, json!({"type": "urn:lockprobe:error:lock-held"}), Some("5"))),
        Outcome::Block
    );
    assert_eq!(
        classify(UserOp::Write, &reply(423, json!({"type": "urn:lockprobe:error:lock-held"}), None)),
        Outcome::BlockWithoutRetryAfter
    );
    assert_eq!(classify(UserOp::Delete, &reply(204, Value::Null, None)), Outcome::Allow);
    assert_eq!(classify(UserOp::Delete, &reply(202, json!({"tombstone": true}), None)), Outcome::Tombstone);
    assert_eq!(
        classify(UserOp::Delete, &reply(500, json!({"type": "urn:lockprobe:error:store-unavailable"}), None)),
        Outcome::reply(500, Some("store-unavailable"))
    );
}

#[test]
fn route_summary_distinguishes_outcomes() {
    assert_eq!(route_summary(&reply(200, json!({"location": "b", "lock": null}), None), "b"), Outcome::MovedUnlocked);
    assert_eq!(route_summary(&reply(200, json!({"location": "a", "lock": null}), None), "b"), Outcome::NotMoved);
    assert_eq!(
        route_summary(&reply(200, json!({"location": "b", "lock": {"phase": "write"}}), None), "b"),
        Outcome::MovedStillLocked
    );
}

#[test]
fn a_cycle_has_one_resource_per_negative_check_plus_the_main_one() {
    assert_eq!(crate::probe::checks::settings::RESOURCES_PER_CYCLE, 1 + Negative::ALL.len());
}

#[test]
fn lock_view_timestamps_must_be_in_the_contracts_order() {
    use super::check::LockTimes;
    let view = |expires: &str, pre_lock: &str| {
        json!({
            "acquiredAt": "2026-01-01T00:00:00Z",
            "effectiveAt": "2026-01-01T00:00:02Z",
            "expiresAt": expires,
            "preLockExpiresAt": pre_lock,
            "maxExpiresAt": "2026-01-03T00:00:02Z",
        })
    };
    let good = LockTimes::of(&view("2026-01-01T00:10:00Z", "2026-01-01T00:10:00Z")).unwrap();
    assert_eq!(good.disorder(), None);
    // The maximum counted from the acquisition: two days and two seconds here.
    assert_eq!(good.maximum(), Some(Duration::from_secs(2 * 86400 + 2)));
    // A child lease past the pre-lock.
    let late = LockTimes::of(&view("2026-01-01T00:20:00Z", "2026-01-01T00:10:00Z")).unwrap();
    assert!(late.disorder().unwrap().starts_with("expiresAt"), "{:?}", late.disorder());
    // A lease that ends before it starts restricting.
    let early = LockTimes::of(&view("2026-01-01T00:00:01Z", "2026-01-01T00:10:00Z")).unwrap();
    assert!(early.disorder().unwrap().starts_with("effectiveAt"), "{:?}", early.disorder());
    let mut missing = view("2026-01-01T00:10:00Z", "2026-01-01T00:10:00Z");
    missing.as_object_mut().unwrap().remove("maxExpiresAt");
    assert_eq!(LockTimes::of(&missing).unwrap_err(), "no RFC 3339 maxExpiresAt");
}

#[test]
fn the_worst_case_cycle_adds_the_main_walk_and_the_lapse_check() {
    use crate::probe::checks::settings::CycleWaits;
    let s = Duration::from_secs_f64;
    // Declared 1.5s, buffer 500ms: 2s before escalating.
    let w = CycleWaits::new(s(1.5), s(0.5), s(0.5), s(0.2), s(1.0));
    assert_eq!(w.escalation, s(2.0));
    assert_eq!(w.main_walk, s(3.0 + 2.0 + 5.0));
    assert_eq!(w.lapse_check, s(2.0 + 1.0 + 0.5 + 5.0));
    assert_eq!(w.total(), s(18.5));
    // A replication bound above declared + buffer is what the probe waits.
    assert_eq!(CycleWaits::new(s(1.0), s(0.0), s(4.0), s(0.2), s(1.0)).escalation, s(4.0));
    // A slow poll makes the convergence watch outlast the wait.
    assert_eq!(CycleWaits::new(s(1.0), s(0.0), s(0.0), s(2.0), s(1.0)).main_walk, s(3.0 + 3.1 + 5.0));
}
