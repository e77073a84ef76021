//! Property tests of the monitor's inference: honest migration histories, delivered in
//! full or with versions dropped (latest-only delivery), never raise a false alarm, and
//! in full are classified exactly.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lockprobe::clock::to_chrono;
use lockprobe::monitor::{Event, Outcome, Rules, Seen, Tracker};
use lockprobe::routing::lifecycle::{self, LockPolicy, PreLockRequest};
use lockprobe::routing::{LocationDocument, LockToken, Phase};
use proptest::prelude::*;

const S: Duration = Duration::from_secs(1);
const DELAY: u64 = 10;
const BUFFER: u64 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Swap,
    Release,
    Abandon,
}

#[derive(Debug, Clone)]
struct Plan {
    extra_wait: u64,
    hd_lease: u64,
    renewals: u64,
    write_after: u64,
    end: End,
    end_after: u64,
}

fn plan() -> impl Strategy<Value = Plan> {
    (
        0..10u64,
        20..60u64,
        0..3u64,
        1..10u64,
        prop_oneof![Just(End::Swap), Just(End::Release), Just(End::Abandon)],
        1..20u64,
    )
        .prop_map(|(extra_wait, hd_lease, renewals, write_after, end, end_after)| Plan {
            extra_wait,
            hd_lease,
            renewals,
            write_after,
            end,
            end_after,
        })
}

fn at(t0: DateTime<Utc>, secs: u64) -> DateTime<Utc> {
    t0 + to_chrono(S * secs as u32)
}

/// Runs the plans one after another on one document; returns every committed version
/// with its commit time, and the outcomes in order.
fn history(plans: &[Plan]) -> (Vec<(LocationDocument, DateTime<Utc>)>, Vec<Outcome>) {
    let t0 = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().to_utc();
    // No skew margin: escalations come exactly at the declared delay.
    let policy = LockPolicy { skew_margin: Duration::ZERO, ..LockPolicy::new(S * DELAY as u32, 3600 * S) };
    let mut doc = LocationDocument::new("r", "westeurope");
    let mut t = 0;
    let mut versions = Vec::new();
    let mut outcomes = Vec::new();
    for p in plans {
        let target = if doc.primary.location == "westeurope" { "northeurope" } else { "westeurope" };
        let token = LockToken::generate();
        let req = PreLockRequest { owner: "p".into(), duration: 600 * S, target_location: Some(target.into()) };
        doc = lifecycle::pre_lock(&doc, &req, token.clone(), &policy, at(t0, t)).unwrap();
        versions.push((doc.clone(), at(t0, t)));
        t += DELAY + BUFFER + p.extra_wait;
        doc = lifecycle::escalate(&doc, &token, Phase::HardDelete, S * p.hd_lease as u32, &policy, at(t0, t)).unwrap();
        versions.push((doc.clone(), at(t0, t)));
        for _ in 0..p.renewals {
            t += 1;
            doc = lifecycle::renew(&doc, &token, S * p.hd_lease as u32, &policy, at(t0, t)).unwrap();
            versions.push((doc.clone(), at(t0, t)));
        }
        t += p.write_after;
        doc = lifecycle::escalate(&doc, &token, Phase::Write, 30 * S, &policy, at(t0, t)).unwrap();
        versions.push((doc.clone(), at(t0, t)));
        match p.end {
            End::Swap => {
                t += p.end_after;
                doc = lifecycle::swap(&doc, &token, target, &policy, at(t0, t)).unwrap();
                versions.push((doc.clone(), at(t0, t)));
                outcomes.push(Outcome::Swapped);
            }
            End::Release => {
                t += p.end_after;
                doc = lifecycle::release(&doc, &token, at(t0, t)).unwrap();
                versions.push((doc.clone(), at(t0, t)));
                outcomes.push(Outcome::Released);
            }
            End::Abandon => {
                t += 30 + p.end_after;
                outcomes.push(Outcome::Lapsed);
            }
        }
        t += 1;
    }
    (versions, outcomes)
}

/// Delivers the versions whose `keep` bit is set (the last always), sweeping after
/// each, then sweeps and scans far in the future.
fn deliver(versions: &[(LocationDocument, DateTime<Utc>)], keep: &[bool]) -> (Tracker, Vec<Event>) {
    let mut tracker = Tracker::new(Rules {
        escalation_buffer: Duration::from_secs(BUFFER),
        declared_delay: Some(Duration::from_secs(DELAY)),
        lapse_grace: Duration::ZERO,
    });
    let mut events = Vec::new();
    let last = versions.len() - 1;
    for (i, (doc, when)) in versions.iter().enumerate() {
        if i != last && !keep.get(i).copied().unwrap_or(true) {
            continue;
        }
        tracker.observe(doc, *when, Seen::Stream, &mut events);
        let mut swept = Vec::new();
        tracker.sweep(*when, &mut swept);
        events.extend(swept.into_iter().map(|(_, e)| e));
    }
    let (doc, when) = &versions[last];
    let end = *when + chrono::TimeDelta::hours(1);
    let mut swept = Vec::new();
    tracker.sweep(end, &mut swept);
    events.extend(swept.into_iter().map(|(_, e)| e));
    tracker.observe(doc, end, Seen::Scan, &mut events);
    (tracker, events)
}

fn ended(events: &[Event]) -> Vec<Outcome> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Ended(o) => Some(*o),
            _ => None,
        })
        .collect()
}

fn alarms(events: &[Event]) -> usize {
    events.iter().filter(|e| matches!(e, Event::PartialCutover | Event::Escalation { early: true, .. })).count()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn full_delivery_is_classified_exactly(plans in prop::collection::vec(plan(), 1..8)) {
        let (versions, outcomes) = history(&plans);
        let (tracker, events) = deliver(&versions, &[]);
        prop_assert_eq!(ended(&events), outcomes);
        prop_assert_eq!(alarms(&events), 0);
        prop_assert_eq!(tracker.in_flight(), 0);
        let orphan = usize::from(plans.last().unwrap().end == End::Abandon);
        prop_assert_eq!(tracker.orphans(), orphan);
        let held = events.iter().filter(|e| matches!(e, Event::PhaseHeld { .. })).count();
        prop_assert_eq!(held, 3 * plans.len(), "every phase of every migration timed once");
    }

    #[test]
    fn dropped_versions_never_raise_a_false_alarm_or_double_count(
        plans in prop::collection::vec(plan(), 1..8),
        keep in prop::collection::vec(any::<bool>(), 64),
    ) {
        let (versions, outcomes) = history(&plans);
        let (tracker, events) = deliver(&versions, &keep);
        prop_assert_eq!(alarms(&events), 0, "{:?}", events);
        let started = events.iter().filter(|e| **e == Event::Started).count();
        let ends = ended(&events).len();
        prop_assert!(started <= outcomes.len() && ends <= started, "started {} ended {} of {}", started, ends, outcomes.len());
        prop_assert_eq!(tracker.in_flight(), 0);
        prop_assert!(tracker.orphans() <= 1);
        // A timed escalation interval is exact, never a bound passed off as a measurement.
        let intervals: Vec<Duration> = plans.iter().map(|p| S * (DELAY + BUFFER + p.extra_wait) as u32).collect();
        for e in &events {
            if let Event::Escalation { interval: Some(i), .. } = e {
                prop_assert!(intervals.contains(i), "{:?} is no pre-lock -> hardDelete interval of {:?}", e, intervals);
            }
        }
    }
}
