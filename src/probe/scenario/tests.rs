//! Unit tests of the outcome vocabulary.

use super::check::classify;
use super::negative::Negative;
use super::walk::route_summary;
use crate::probe::target::Reply;
use crate::probe::vocabulary::{Outcome, UserOp};
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
    assert_eq!(crate::probe::settings::RESOURCES_PER_CYCLE, 1 + Negative::ALL.len());
}
