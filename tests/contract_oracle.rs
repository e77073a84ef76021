//! The campaign's second oracle (`support/contract_oracle.rs`) shown to bite: for each
//! kind of violation it reports, a recorded history with that violation planted is
//! reported with that kind, and its clean twin (the same history, the one exchange that
//! breaks the promise changed to what the contract allows, or moved out of the window
//! in which the lock was certainly in force) reports nothing.

#[path = "support/contract_oracle.rs"]
mod contract_oracle;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use contract_oracle::{judge, Call, Declared, Exchange, Finals};
use serde_json::{json, Value};

const AGE: Duration = Duration::from_millis(500);

/// An instant, `ms` milliseconds into the run.
fn t(ms: i64) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().to_utc() + TimeDelta::milliseconds(ms)
}

fn iso(ms: i64) -> String {
    t(ms).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// One exchange sent at `sent` ms and answered at `answered` ms.
fn x(actor: &str, call: Call, (sent, answered): (i64, i64), status: u16, body: Value) -> Exchange {
    Exchange {
        actor: actor.to_owned(),
        resource: "r0".to_owned(),
        call,
        token: None,
        key: None,
        sent: t(sent),
        answered: t(answered),
        status,
        body,
        route: None,
    }
}

fn with_token(mut e: Exchange, token: &str) -> Exchange {
    e.token = Some(token.to_owned());
    e
}

fn with_key(mut e: Exchange, key: &str) -> Exchange {
    e.key = Some(key.to_owned());
    e
}

fn via(mut e: Exchange, route: &str) -> Exchange {
    e.route = Some(route.to_owned());
    e
}

/// A migration by `o0` with token `A`: pre-lock at 0 (lease to 20 s), hard delete from
/// 2 s (lease to 10 s), write from 5 s (lease to 8 s), released at 7 s.
fn migration() -> Vec<Exchange> {
    vec![
        with_key(
            x(
                "o0",
                Call::PreLock { duration: 20.0 },
                (0, 0),
                201,
                json!({"token": "A", "phase": "preLock", "effectiveAt": iso(1_000), "expiresAt": iso(20_000)}),
            ),
            "k-pre",
        ),
        with_token(
            x(
                "o0",
                Call::Escalate { phase: "hardDelete".into(), duration: 8.0 },
                (2_000, 2_000),
                200,
                json!({"token": "A", "phase": "hardDelete", "expiresAt": iso(10_000)}),
            ),
            "A",
        ),
        with_token(
            x(
                "o0",
                Call::Escalate { phase: "write".into(), duration: 3.0 },
                (5_000, 5_000),
                200,
                json!({"token": "A", "phase": "write", "expiresAt": iso(8_000)}),
            ),
            "A",
        ),
        with_token(x("o0", Call::Release, (7_000, 7_000), 204, Value::Null), "A"),
    ]
}

fn kinds(exchanges: &[Exchange], finals: &Finals) -> Vec<&'static str> {
    judge(exchanges, finals, &Declared { decision_age: AGE }).into_iter().map(|v| v.kind).collect()
}

/// The migration plus `extra`, no final reads.
fn found(extra: Vec<Exchange>) -> Vec<&'static str> {
    let mut all = migration();
    all.extend(extra);
    kinds(&all, &Finals::new())
}

fn write(key: &str, n: i64, window: (i64, i64), status: u16) -> Exchange {
    let value = json!({"n": n});
    x(
        "u0",
        Call::Write { key: key.into(), value: value.clone() },
        window,
        status,
        json!({"key": key, "value": value, "tombstone": false}),
    )
}

fn delete(key: &str, window: (i64, i64), status: u16) -> Exchange {
    let body = if status == 202 { json!({"tombstone": true}) } else { Value::Null };
    x("u0", Call::Delete { key: key.into() }, window, status, body)
}

fn read(key: &str, window: (i64, i64), status: u16, body: Value) -> Exchange {
    x("u0", Call::Read { key: key.into() }, window, status, body)
}

#[test]
fn the_migration_alone_is_clean() {
    assert_eq!(found(vec![]), Vec::<&str>::new());
}

#[test]
fn a_write_accepted_under_the_write_lock_is_reported_and_one_refused_is_not() {
    assert_eq!(found(vec![write("k", 1, (6_000, 6_010), 201)]), ["write-under-write-lock"]);
    assert_eq!(found(vec![write("k", 1, (6_000, 6_010), 423)]), Vec::<&str>::new());
}

#[test]
fn an_operation_whose_window_reaches_outside_the_lock_is_not_judged() {
    // Sent before the escalation's answer plus the decision age: it may have been
    // decided before the write lock existed.
    assert_eq!(found(vec![write("k", 1, (5_200, 5_300), 201)]), Vec::<&str>::new());
    // Answered after the release was sent: it may have been decided after the release.
    assert_eq!(found(vec![write("k", 1, (6_900, 7_100), 201)]), Vec::<&str>::new());
    // After the write lease's end.
    assert_eq!(found(vec![write("k", 1, (8_000, 8_000), 201)]), Vec::<&str>::new());
}

#[test]
fn deletes_are_judged_by_phase() {
    // Under the hard-delete lock a delete is a tombstone (202), not a removal (204).
    assert_eq!(found(vec![delete("k", (3_000, 3_000), 204)]), ["delete-under-hard-delete"]);
    assert_eq!(found(vec![delete("k", (3_000, 3_000), 202)]), Vec::<&str>::new());
    // Under the write lock every delete is refused (423).
    assert_eq!(found(vec![delete("k", (6_000, 6_000), 202)]), ["delete-under-write-lock"]);
    assert_eq!(found(vec![delete("k", (6_000, 6_000), 204)]), ["delete-under-write-lock"]);
    assert_eq!(found(vec![delete("k", (6_000, 6_000), 423)]), Vec::<&str>::new());
}

#[test]
fn a_read_under_the_write_lock_must_come_through_the_write_region() {
    assert_eq!(found(vec![via(read("k", (6_000, 6_000), 404, Value::Null), "cache")]), ["read-not-read-through"]);
    assert_eq!(found(vec![via(read("k", (6_000, 6_000), 404, Value::Null), "read-through")]), Vec::<&str>::new());
    // Before the write lock, a cached read is fine.
    assert_eq!(found(vec![via(read("k", (3_000, 3_000), 404, Value::Null), "cache")]), Vec::<&str>::new());
}

#[test]
fn a_pre_lock_granted_while_another_is_held_is_a_second_holder() {
    let rival = |window| {
        x("o1", Call::PreLock { duration: 20.0 }, window, 201, json!({"token": "B", "expiresAt": iso(40_000)}))
    };
    assert_eq!(found(vec![rival((4_000, 4_000))]), ["two-holders"]);
    // After the release was sent: the first lock may have ended.
    assert_eq!(found(vec![rival((7_500, 7_500))]), Vec::<&str>::new());
    // Refused (423), as the contract says.
    let refused = x(
        "o1",
        Call::PreLock { duration: 20.0 },
        (4_000, 4_000),
        423,
        json!({"type": "urn:lockprobe:error:lock-held"}),
    );
    assert_eq!(found(vec![refused]), Vec::<&str>::new());
}

#[test]
fn a_renewal_answered_after_its_lease_still_holds_the_resource() {
    // A renewal's answer tells the lease as it stands: a lock renewed to 30 s is held
    // after the 20 s the pre-lock answer showed.
    let mut all = vec![
        x("o0", Call::PreLock { duration: 20.0 }, (0, 0), 201, json!({"token": "A", "expiresAt": iso(20_000)})),
        with_token(x("o0", Call::Renew, (19_000, 19_500), 200, json!({"token": "A", "expiresAt": iso(30_000)})), "A"),
    ];
    all.push(x(
        "o1",
        Call::PreLock { duration: 20.0 },
        (25_000, 25_000),
        201,
        json!({"token": "B", "expiresAt": iso(45_000)}),
    ));
    assert_eq!(kinds(&all, &Finals::new()), ["two-holders"]);
    all.pop();
    all.push(x(
        "o1",
        Call::PreLock { duration: 20.0 },
        (31_000, 31_000),
        201,
        json!({"token": "B", "expiresAt": iso(51_000)}),
    ));
    assert_eq!(kinds(&all, &Finals::new()), Vec::<&str>::new());
}

#[test]
fn a_repeated_pre_lock_granted_a_fresh_lock_is_reported() {
    let repeat = |token: &str| {
        with_key(
            x(
                "o0",
                Call::PreLock { duration: 20.0 },
                (30_000, 30_000),
                201,
                json!({"token": token, "expiresAt": iso(50_000)}),
            ),
            "k-pre",
        )
    };
    assert_eq!(found(vec![repeat("C")]), ["fresh-lock-for-a-key"]);
    assert_eq!(found(vec![repeat("A")]), Vec::<&str>::new());
}

#[test]
fn items_must_read_back_what_was_acknowledged() {
    let value = |n| json!({"key": "k", "value": {"n": n}, "tombstone": false});
    let tombstone = json!({"key": "k", "value": null, "tombstone": true});
    let finals = |status, body| {
        let mut f = Finals::new();
        f.insert(
            ("r0".into(), "k".into()),
            x("read-back", Call::Read { key: "k".into() }, (60_000, 60_000), status, body),
        );
        f
    };
    let history = vec![write("k", 1, (100, 110), 201), write("k", 2, (200, 210), 200)];
    // A read after the second write that sees the first: stale.
    let mut stale = history.clone();
    stale.push(read("k", (300, 310), 200, value(1)));
    assert_eq!(kinds(&stale, &Finals::new()), ["not-linearizable"]);
    let mut fresh = history.clone();
    fresh.push(read("k", (300, 310), 200, value(2)));
    assert_eq!(kinds(&fresh, &Finals::new()), Vec::<&str>::new());
    // A read concurrent with the second write may see either.
    let mut concurrent = history.clone();
    concurrent.push(x("u1", Call::Read { key: "k".into() }, (205, 206), 200, value(1)));
    assert_eq!(kinds(&concurrent, &Finals::new()), Vec::<&str>::new());
    // A lost write: the final read-back shows the first value.
    assert_eq!(kinds(&history, &finals(200, value(1))), ["not-linearizable"]);
    assert_eq!(kinds(&history, &finals(200, value(2))), Vec::<&str>::new());
    // A tombstone (202) that reads back as the value it hid, or is gone: resurrected or
    // lost; read back as a tombstone: kept.
    let mut tombstoned = history.clone();
    tombstoned.push(delete("k", (400, 410), 202));
    assert_eq!(kinds(&tombstoned, &finals(200, value(2))), ["not-linearizable"]);
    assert_eq!(kinds(&tombstoned, &finals(404, Value::Null)), ["not-linearizable"]);
    assert_eq!(kinds(&tombstoned, &finals(200, tombstone)), Vec::<&str>::new());
    // A removal (204) that reads back present.
    let mut removed = history;
    removed.push(delete("k", (400, 410), 204));
    assert_eq!(kinds(&removed, &finals(200, value(2))), ["not-linearizable"]);
    assert_eq!(kinds(&removed, &finals(404, Value::Null)), Vec::<&str>::new());
}
