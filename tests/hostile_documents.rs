//! Stored documents are input like any other (issue 29, item 6): a value no writer would
//! store, in a document that is otherwise well formed, must never take a reader down.
//! A duration of `1e308` seconds used to panic the route and item handlers (time
//! arithmetic overflowed; the connection dropped with no answer). Every stored duration
//! and instant is now checked when the document is read, and the service answers such a
//! document with 500 `invalid-document`.
//!
//! A property test mutates one value of a live, escalated lock document into anything
//! JSON can hold and drives the result through decode, settle, route resolution, user
//! operations and every lock call on the routing library: a refusal is fine, a panic is
//! not.

#[path = "support/service.rs"]
mod service;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lockprobe::clock::ManualClock;
use lockprobe::document::{DocumentError, LocationDocument};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::lifecycle::{self, LockPolicy};
use lockprobe::routing::{enforce, ClientOptions, LockToken, Operation, Phase, PreLockRequest, RoutingClient};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use proptest::prelude::*;
use serde_json::{json, Value};

const S: Duration = Duration::from_secs(1);

fn policy() -> LockPolicy {
    LockPolicy::declared(S, S, 3600 * S)
}

fn start() -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse().unwrap()
}

/// A document holding a live write lock, and its token: the phase in which most stored
/// values are read (effective, lease, ceiling, delay).
fn locked() -> (Value, LockToken) {
    let doc = LocationDocument::new("probe-hostile", "westeurope");
    let req = PreLockRequest { owner: "t".into(), duration: 600 * S, target_location: Some("northeurope".into()) };
    let token = LockToken::generate();
    let at = |secs: i64| start() + chrono::TimeDelta::seconds(secs);
    let pre = lifecycle::pre_lock(&doc, &req, token.clone(), &policy(), at(0)).unwrap();
    let hard = lifecycle::escalate(&pre, &token, Phase::HardDelete, 300 * S, &policy(), at(10)).unwrap();
    let write = lifecycle::escalate(&hard, &token, Phase::Write, 60 * S, &policy(), at(20)).unwrap();
    (write.to_json(), token)
}

/// Every path to a scalar in `value`, as JSON pointers.
fn leaves(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => map.iter().for_each(|(k, v)| leaves(v, format!("{at}/{k}"), out)),
        Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| leaves(v, format!("{at}/{i}"), out)),
        _ => out.push(at),
    }
}

/// What a hostile or careless writer might leave in a field.
fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(|f| json!(f)),
        prop_oneof![Just(1e308), Just(-1e308), Just(f64::MAX), Just(f64::MIN_POSITIVE), Just(-0.5)]
            .prop_map(|f| json!(f)),
        any::<i64>().prop_map(|i| json!(i)),
        any::<u64>().prop_map(|u| json!(u)),
        prop_oneof![
            Just("0001-01-01T00:00:00Z"),
            Just("9999-12-31T23:59:59.999999999Z"),
            Just("+262142-12-31T23:59:59Z"),
            Just("-262143-01-01T00:00:00Z"),
            Just("1969-12-31T23:59:59Z"),
            Just("2026-12-01T00:00:00+14:00"),
        ]
        .prop_map(|s| json!(s)),
        (-8_000_000_000_000i64..8_000_000_000_000i64)
            .prop_filter_map("in chrono's range", |secs| DateTime::<Utc>::from_timestamp(secs, 0))
            .prop_map(|t| json!(t.to_rfc3339())),
        ".{0,12}".prop_map(|s| json!(s)),
        Just(Value::Null),
        any::<bool>().prop_map(|b| json!(b)),
        Just(json!({})),
        Just(json!([])),
    ]
}

/// Drives `stored` through everything that reads a document; panics only if a reader
/// does.
async fn read_everything(stored: Value, token: &LockToken, now: DateTime<Utc>) {
    let decoded = LocationDocument::from_json(stored.clone());
    if let Ok(doc) = &decoded {
        let settled = lifecycle::settle_view(doc, now);
        for op in [Operation::Read, Operation::Write, Operation::Delete] {
            enforce(op, settled.primary.lock.as_ref(), now, S);
        }
    }
    let clock = Arc::new(ManualClock::new(now));
    let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    store.put_raw("probe-hostile", stored);
    let client = RoutingClient::new(
        store,
        clock.clone(),
        TieredCache::try_new(&[S]).unwrap(),
        policy(),
        ClientOptions::default(),
    );
    let read = client.resolve("probe-hostile").await;
    if let Err(lockprobe::routing::RoutingError::Document(e)) = &read {
        assert!(decoded.is_err(), "resolve refused what decode took: {e}");
    }
    let req = PreLockRequest { owner: "x".into(), duration: 60 * S, target_location: None };
    let _ = client.escalate("probe-hostile", token, Phase::Write, 30 * S).await;
    let _ = client.renew("probe-hostile", token, 30 * S).await;
    let _ = client.swap("probe-hostile", token, "northeurope").await;
    let _ = client.release("probe-hostile", token).await;
    clock.advance(3600 * S);
    let _ = client.pre_lock("probe-hostile", &req).await;
    let _ = client.resolve("probe-hostile").await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_stored_value_takes_a_reader_down(pick in any::<prop::sample::Index>(), value in hostile_value(), offset in 0i64..700) {
        let (stored, token) = locked();
        let mut paths = Vec::new();
        leaves(&stored, String::new(), &mut paths);
        let path = pick.get(&paths).clone();
        let mut hostile = stored.clone();
        *hostile.pointer_mut(&path).expect("a leaf") = value;
        let now = start() + chrono::TimeDelta::seconds(offset);
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(read_everything(hostile, &token, now));
    }
}

#[test]
fn a_stored_value_out_of_range_is_refused_at_decode_naming_its_field() {
    let (stored, _) = locked();
    for (pointer, value, field) in [
        ("/primary/lock/convergenceDelaySeconds", json!(1e308), "primary.lock.convergenceDelaySeconds"),
        ("/primary/lock/convergenceDelaySeconds", json!(-1), "primary.lock.convergenceDelaySeconds"),
        ("/primary/lock/expiresAt", json!("+262142-12-31T23:59:59Z"), "primary.lock.expiresAt"),
        ("/primary/lock/maxExpiresAt", json!("-0001-01-01T00:00:00Z"), "primary.lock.maxExpiresAt"),
    ] {
        let mut hostile = stored.clone();
        *hostile.pointer_mut(pointer).unwrap() = value.clone();
        match LocationDocument::from_json(hostile) {
            Err(DocumentError::Malformed(why)) => assert!(why.contains(field), "{pointer} = {value}: {why}"),
            other => panic!("{pointer} = {value}: {other:?}"),
        }
    }
    // The widest values a writer may store still read.
    let mut wide = stored.clone();
    wide["primary"]["lock"]["convergenceDelaySeconds"] = json!(315_576_000.0);
    wide["primary"]["lock"]["maxExpiresAt"] = json!("9999-12-31T23:59:59Z");
    LocationDocument::from_json(wide).unwrap();
}

/// The case that dropped connections: every call on the document is answered, with
/// 500 `invalid-document`, on every instance, and the document is never written.
#[tokio::test]
async fn the_service_answers_a_hostile_document_with_invalid_document() {
    let ttl = Duration::from_millis(200);
    let (running, store) = service::start_service_keeping_store(Vec::new(), ttl, ttl, &[]).await;
    let (mut stored, token) = locked();
    stored["primary"]["lock"]["convergenceDelaySeconds"] = json!(1e308);
    store.put_raw("probe-hostile", stored);
    let logged = store.changes_logged();
    let http = reqwest::Client::new();
    let bearer = format!("Bearer {}", running.key);
    for url in &running.urls {
        let base = format!("{url}/v1/resources/probe-hostile");
        let calls = [
            ("route", http.get(format!("{base}/route"))),
            ("read", http.get(format!("{base}/items/k"))),
            ("write", http.put(format!("{base}/items/k")).json(&json!({"value": 1}))),
            ("delete", http.delete(format!("{base}/items/k"))),
            (
                "renew",
                http.post(format!("{base}/lock/renew"))
                    .header("authorization", &bearer)
                    .json(&json!({"token": token.expose(), "durationSeconds": 60})),
            ),
        ];
        for (what, request) in calls {
            let answer = request.send().await.unwrap_or_else(|e| panic!("{what} on {url}: no answer: {e}"));
            let status = answer.status().as_u16();
            let problem: Value = answer.json().await.unwrap_or_else(|e| panic!("{what} on {url}: {e}"));
            assert_eq!(
                (status, problem["type"].as_str()),
                (500, Some("urn:lockprobe:error:invalid-document")),
                "{what} on {url}: {problem}"
            );
            assert!(!problem.to_string().contains(token.expose()), "{what}: the token leaked: {problem}");
        }
    }
    assert_eq!(store.changes_logged(), logged, "the service wrote over a hostile document");
}
