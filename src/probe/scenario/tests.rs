//! Unit tests of the outcome vocabulary.

use super::check::classify;
use super::negative::Negative;
use super::walk::route_summary;
use crate::probe::target::Reply;
use serde_json::{json, Value};
use std::time::Duration;

fn reply(status: u16, body: Value, retry_after: Option<&str>) -> Reply {
    Reply {
        status,
        problem: (status >= 400).then(|| {
            body["type"]
                .as_str()
                .unwrap_or("x")
                .trim_start_matches("urn:lockprobe:error:")
                .to_string()
        }),
        body,
        retry_after: retry_after.map(str::to_string),
        timing: None,
        elapsed: Duration::ZERO,
    }
}

#[test]
fn classify_follows_the_enforcement_table() {
    assert_eq!(
        classify("read", &reply(200, json!({"tombstone": false}), None)),
        "allow"
    );
    assert_eq!(
        classify("read", &reply(200, json!({"tombstone": true}), None)),
        "tombstone"
    );
    assert_eq!(classify("read", &reply(404, json!({}), None)), "absent");
    assert_eq!(classify("write", &reply(201, json!({}), None)), "allow");
    assert_eq!(
        classify(
            "write",
            &reply(
                423,
                json!({"type": "urn:lockprobe:error:lock-held"}),
                Some("5")
            )
        ),
        "block"
    );
    assert_eq!(
        classify(
            "write",
            &reply(423, json!({"type": "urn:lockprobe:error:lock-held"}), None)
        ),
        "423 without Retry-After"
    );
    assert_eq!(classify("delete", &reply(204, Value::Null, None)), "allow");
    assert_eq!(
        classify("delete", &reply(202, json!({"tombstone": true}), None)),
        "tombstone"
    );
    assert_eq!(
        classify(
            "delete",
            &reply(
                500,
                json!({"type": "urn:lockprobe:error:store-unavailable"}),
                None
            )
        ),
        "500 store-unavailable"
    );
}

#[test]
fn route_summary_distinguishes_outcomes() {
    assert_eq!(
        route_summary(
            &reply(200, json!({"location": "b", "lock": null}), None),
            "b"
        ),
        "moved-unlocked"
    );
    assert_eq!(
        route_summary(
            &reply(200, json!({"location": "a", "lock": null}), None),
            "b"
        ),
        "not-moved"
    );
    assert_eq!(
        route_summary(
            &reply(
                200,
                json!({"location": "b", "lock": {"phase": "write"}}),
                None
            ),
            "b"
        ),
        "moved-still-locked"
    );
}

#[test]
fn a_cycle_has_one_resource_per_negative_check_plus_the_main_one() {
    assert_eq!(
        crate::probe::settings::RESOURCES_PER_CYCLE,
        1 + Negative::ALL.len()
    );
}
