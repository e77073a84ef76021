use std::time::Duration;

use chrono::{DateTime, Utc};

use super::*;
use crate::clock::to_chrono;
use crate::document::{LocationDocument, LockToken};
use crate::routing::lifecycle::{self, LockPolicy, PreLockRequest};

const S: Duration = Duration::from_secs(1);

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().to_utc()
}

fn at(secs: u64) -> DateTime<Utc> {
    t0() + to_chrono(S * secs as u32)
}

fn policy() -> LockPolicy {
    LockPolicy {
        convergence_delay: 10 * S,
        max_pre_lock: 600 * S,
        skew_margin: Duration::ZERO,
        keyed_records: crate::routing::lifecycle::DEFAULT_KEYED_RECORDS,
        write_format: crate::document::NEWEST_FORMAT,
        force_release_window: crate::routing::lifecycle::DEFAULT_FORCE_RELEASE_WINDOW,
        deviations: Default::default(),
    }
}

fn rules() -> Rules {
    Rules { escalation_buffer: 5 * S, declared_delay: None, lapse_grace: 5 * S }
}

fn req() -> PreLockRequest {
    PreLockRequest { owner: "t".into(), duration: 300 * S, target_location: Some("northeurope".into()) }
}

struct Mig {
    token: LockToken,
    docs: Vec<(LocationDocument, DateTime<Utc>)>,
}

/// A full honest migration: pre-lock at 0, hardDelete at `hd`, write at `w`, swap at `sw`.
fn migration(hd: u64, w: u64, sw: u64) -> Mig {
    let doc = LocationDocument::new("r1", "westeurope");
    let token = LockToken::generate();
    let pre = lifecycle::pre_lock(&doc, &req(), token.clone(), &policy(), at(0)).unwrap();
    let hard = lifecycle::escalate(&pre, &token, Phase::HardDelete, 100 * S, &policy(), at(hd)).unwrap();
    let write = lifecycle::escalate(&hard, &token, Phase::Write, 30 * S, &policy(), at(w)).unwrap();
    let swapped = lifecycle::swap(&write, &token, "northeurope", &policy(), at(sw)).unwrap();
    Mig { token, docs: vec![(pre, at(0)), (hard, at(hd)), (write, at(w)), (swapped, at(sw))] }
}

fn feed(tracker: &mut Tracker, docs: &[(LocationDocument, DateTime<Utc>)]) -> Vec<Event> {
    let mut out = Vec::new();
    for (doc, when) in docs {
        tracker.observe(doc, *when, Seen::Stream, &mut out);
    }
    out
}

fn held(events: &[Event], phase: Phase) -> Vec<Duration> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PhaseHeld { phase: p, held } if *p == phase => Some(*held),
            _ => None,
        })
        .collect()
}

fn count(events: &[Event], wanted: &Event) -> usize {
    events.iter().filter(|e| *e == wanted).count()
}

#[test]
fn an_honest_migration_is_timed_phase_by_phase() {
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    let events = feed(&mut tracker, &mig.docs);
    assert_eq!(held(&events, Phase::PreLock), [15 * S]);
    assert_eq!(held(&events, Phase::HardDelete), [25 * S]);
    assert_eq!(held(&events, Phase::Write), [12 * S]);
    assert!(events.contains(&Event::Escalation { interval: Some(15 * S), required: 15 * S, early: false }));
    assert_eq!(count(&events, &Event::Ended(Outcome::Swapped)), 1);
    assert_eq!(count(&events, &Event::PartialCutover), 0);
    assert_eq!((tracker.in_flight(), tracker.orphans()), (0, 0));
}

#[test]
fn escalating_inside_the_buffer_is_early() {
    // effectiveAt is at 10 s; the lifecycle allows hardDelete then, but the buffer says 15 s.
    let mig = migration(12, 40, 52);
    let events = feed(&mut Tracker::new(rules()), &mig.docs);
    assert!(events.contains(&Event::Escalation { interval: Some(12 * S), required: 15 * S, early: true }));
}

#[test]
fn a_lock_declaring_less_than_the_service_is_judged_by_the_service() {
    let mig = migration(16, 40, 52);
    let strict = Rules { declared_delay: Some(20 * S), ..rules() };
    let events = feed(&mut Tracker::new(strict), &mig.docs);
    assert!(events.contains(&Event::Escalation { interval: Some(16 * S), required: 25 * S, early: true }));
}

#[test]
fn latest_only_delivery_still_sees_the_escalation_and_the_swap() {
    // Only the write-lock version and the swap arrive: pre-lock and hardDelete collapsed.
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    let events = feed(&mut tracker, &mig.docs[2..]);
    // Bounded by the write version's time (40 s): late enough, so not early, and untimed.
    assert!(events.contains(&Event::Escalation { interval: None, required: 15 * S, early: false }));
    assert!(held(&events, Phase::PreLock).is_empty(), "a two-step jump times neither step");
    assert_eq!(held(&events, Phase::Write), [12 * S]);
    assert_eq!(count(&events, &Event::Ended(Outcome::Swapped)), 1);

    // Collapsed pre-lock + early hardDelete is still caught: the bound itself is early.
    let early = migration(11, 40, 52);
    let events = feed(&mut Tracker::new(rules()), &early.docs[1..2]);
    assert!(events.iter().any(|e| matches!(e, Event::Escalation { early: true, .. })));
}

#[test]
fn swap_collapsed_with_the_next_pre_lock_is_still_a_swap() {
    let mig = migration(15, 40, 52);
    let swapped = &mig.docs[3].0;
    let next = lifecycle::pre_lock(
        swapped,
        &PreLockRequest { target_location: Some("westeurope".into()), ..req() },
        LockToken::generate(),
        &policy(),
        at(60),
    )
    .unwrap();
    let mut tracker = Tracker::new(rules());
    let mut docs = mig.docs[..3].to_vec();
    docs.push((next, at(60)));
    let events = feed(&mut tracker, &docs);
    assert_eq!(count(&events, &Event::Ended(Outcome::Swapped)), 1);
    assert_eq!(count(&events, &Event::Started), 2);
    assert_eq!(count(&events, &Event::PartialCutover), 0);
    assert_eq!(tracker.in_flight(), 1);
}

#[test]
fn release_and_renewals_are_seen() {
    let mig = migration(15, 40, 52);
    let hard = &mig.docs[1].0;
    let renewed = lifecycle::renew(hard, &mig.token, 100 * S, &policy(), at(20)).unwrap();
    let renewed = lifecycle::renew(&renewed, &mig.token, 100 * S, &policy(), at(25)).unwrap();
    let released = lifecycle::release(&renewed, &mig.token, at(30)).unwrap();
    let mut tracker = Tracker::new(rules());
    let events = feed(&mut tracker, &[mig.docs[0].clone(), mig.docs[1].clone(), (renewed, at(25)), (released, at(30))]);
    assert_eq!(count(&events, &Event::Renewed(2)), 1);
    assert_eq!(count(&events, &Event::Ended(Outcome::Released)), 1);
    assert_eq!(held(&events, Phase::HardDelete), [15 * S]);
}

#[test]
fn a_lapsed_lease_becomes_an_orphan_once_and_clears_on_the_next_lock() {
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    feed(&mut tracker, &mig.docs[..3]); // write lock until 70 s, never swapped
    let mut found = Vec::new();
    tracker.sweep(at(72), &mut found);
    assert!(found.is_empty(), "inside the grace");
    tracker.sweep(at(75), &mut found);
    let events: Vec<Event> = found
        .into_iter()
        .map(|(id, e)| {
            assert_eq!(id, "r1");
            e
        })
        .collect();
    assert_eq!(
        events,
        [Event::PhaseHeld { phase: Phase::Write, held: 30 * S }, Event::Ended(Outcome::Lapsed), Event::OrphanFound]
    );
    assert_eq!((tracker.in_flight(), tracker.orphans()), (0, 1));

    // The scan reads the same expired lock: nothing new.
    let mut out = Vec::new();
    tracker.observe(&mig.docs[2].0, at(80), Seen::Scan, &mut out);
    assert!(out.is_empty(), "{out:?}");
    let mut again = Vec::new();
    tracker.sweep(at(500), &mut again);
    assert!(again.is_empty());

    // A fresh pre-lock over the expired one clears the orphan without a second outcome.
    let retry = lifecycle::pre_lock(&mig.docs[2].0, &req(), LockToken::generate(), &policy(), at(90)).unwrap();
    tracker.observe(&retry, at(90), Seen::Stream, &mut out);
    assert_eq!(out, [Event::OrphanCleared, Event::Started]);
    assert_eq!((tracker.in_flight(), tracker.orphans()), (1, 0));
}

#[test]
fn a_scan_finds_an_orphan_the_stream_never_showed() {
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    let mut out = Vec::new();
    tracker.observe(&mig.docs[0].0, at(1000), Seen::Scan, &mut out);
    assert_eq!(
        out,
        [
            Event::Started,
            Event::PhaseHeld { phase: Phase::PreLock, held: 310 * S },
            Event::Ended(Outcome::Lapsed),
            Event::OrphanFound
        ]
    );
    assert_eq!(tracker.orphan_ids(10), ["r1"]);
}

#[test]
fn new_pre_lock_over_a_lapsed_unseen_lease_counts_a_lapse() {
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    let mut out = feed(&mut tracker, &mig.docs[..2]); // hardDelete lease ends at 115 s
    let retry = lifecycle::pre_lock(&mig.docs[1].0, &req(), LockToken::generate(), &policy(), at(200)).unwrap();
    tracker.observe(&retry, at(200), Seen::Stream, &mut out);
    assert_eq!(count(&out, &Event::Ended(Outcome::Lapsed)), 1);
    assert_eq!(held(&out, Phase::HardDelete), [100 * S]);
    assert_eq!(tracker.orphans(), 0);
}

#[test]
fn partial_cutovers_are_flagged_once_per_migration() {
    let mig = migration(15, 40, 52);
    // Location moved to the target while the write lock remains.
    let mut moved = mig.docs[2].0.clone();
    moved.primary.location = "northeurope".into();
    let mut tracker = Tracker::new(rules());
    let mut out = feed(&mut tracker, &mig.docs[..3]);
    tracker.observe(&moved, at(45), Seen::Stream, &mut out);
    tracker.observe(&moved, at(46), Seen::Scan, &mut out);
    assert_eq!(count(&out, &Event::PartialCutover), 1);

    // First seen already at the target with a lock (e.g. by a scan after a restart).
    let mut fresh = Tracker::new(rules());
    let mut out = Vec::new();
    fresh.observe(&moved, at(46), Seen::Scan, &mut out);
    assert_eq!(count(&out, &Event::PartialCutover), 1);
}

#[test]
fn stale_versions_are_ignored() {
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    let mut out = feed(&mut tracker, &mig.docs[..2]);
    out.clear();
    tracker.observe(&mig.docs[0].0, at(0), Seen::Stream, &mut out);
    assert!(out.is_empty());
}

#[test]
fn tokens_are_not_kept() {
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    feed(&mut tracker, &mig.docs[..2]);
    assert!(!format!("{tracker:?}").contains(mig.token.expose()));
}

#[test]
fn a_lagging_stream_cannot_restart_a_migration_a_scan_saw_end() {
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    feed(&mut tracker, &mig.docs[..2]);
    // The scan reads the write region at 60 s: already swapped.
    let mut out = Vec::new();
    tracker.observe(&mig.docs[3].0, at(60), Seen::Scan, &mut out);
    assert_eq!(count(&out, &Event::Ended(Outcome::Swapped)), 1);
    // Then the stream catches up with versions committed before the scan.
    let late = feed(&mut tracker, &mig.docs[2..]);
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(tracker.in_flight(), 0);
    // The memory of the end is dropped after the grace; a new migration starts clean.
    let mut swept = Vec::new();
    tracker.sweep(at(70), &mut swept);
    assert!(swept.is_empty());
    assert_eq!(tracker.timelines.len(), 0);
    let next = lifecycle::pre_lock(
        &mig.docs[3].0,
        &PreLockRequest { target_location: Some("westeurope".into()), ..req() },
        LockToken::generate(),
        &policy(),
        at(80),
    )
    .unwrap();
    let mut out = Vec::new();
    tracker.observe(&next, at(80), Seen::Stream, &mut out);
    assert_eq!(out, [Event::Started]);
    assert_eq!(tracker.in_flight(), 1);
}

#[test]
fn an_escalation_collapsed_with_a_later_renewal_is_not_timed() {
    // Latest-only delivery: hardDelete at 15 s and a renewal at 25 s arrive as one
    // version, committed at 25 s. 25 s is when the renewal happened, not the escalation.
    let mig = migration(15, 40, 52);
    let renewed = lifecycle::renew(&mig.docs[1].0, &mig.token, 100 * S, &policy(), at(25)).unwrap();
    let write = lifecycle::escalate(&renewed, &mig.token, Phase::Write, 30 * S, &policy(), at(40)).unwrap();
    let swapped = lifecycle::swap(&write, &mig.token, "northeurope", &policy(), at(52)).unwrap();
    let later = [(renewed, at(25)), (write, at(40)), (swapped, at(52))];

    let mut tracker = Tracker::new(rules());
    let mut docs = vec![mig.docs[0].clone()];
    docs.extend(later.iter().cloned());
    let events = feed(&mut tracker, &docs);
    assert!(events.contains(&Event::Escalation { interval: None, required: 15 * S, early: false }), "{events:?}");
    assert!(held(&events, Phase::PreLock).is_empty(), "{events:?}");
    assert!(held(&events, Phase::HardDelete).is_empty(), "its start is unknown: {events:?}");
    assert_eq!(held(&events, Phase::Write), [12 * S]);
    assert_eq!(count(&events, &Event::Renewed(1)), 1);

    // The same when the monitor first meets the migration at the renewed version.
    let events = feed(&mut Tracker::new(rules()), &later);
    assert!(events.contains(&Event::Escalation { interval: None, required: 15 * S, early: false }), "{events:?}");
    assert!(held(&events, Phase::PreLock).is_empty() && held(&events, Phase::HardDelete).is_empty(), "{events:?}");
}

#[test]
fn a_swap_seen_straight_after_an_earlier_phase_times_no_hold() {
    // Latest-only delivery: the pre-lock, then the swap. A swap is made only from the
    // write phase, so hardDelete and write happened unseen and the pre-lock's end is
    // unknown: 52 s would be pre-lock + hardDelete + write passed off as pre-lock.
    let mig = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    let events = feed(&mut tracker, &[mig.docs[0].clone(), mig.docs[3].clone()]);
    assert!(!events.iter().any(|e| matches!(e, Event::PhaseHeld { .. })), "{events:?}");
    assert_eq!(count(&events, &Event::Ended(Outcome::Swapped)), 1);
}

#[test]
fn a_lock_seen_just_past_its_lease_is_not_yet_an_orphan() {
    // The write lease ends at 70 s. A scan at 71 s still finds the lock: a service
    // whose clock lags the monitor's may be swapping under it right now, and does,
    // its swap committed at 71.5 s.
    let mig = migration(15, 40, 52);
    let (write, swapped) = (mig.docs[2].0.clone(), mig.docs[3].0.clone());
    let mut tracker = Tracker::new(rules());
    let mut out = feed(&mut tracker, &mig.docs[..2]);
    tracker.observe(&write, at(71), Seen::Scan, &mut out);
    tracker.observe(&swapped, at(71) + chrono::TimeDelta::milliseconds(500), Seen::Stream, &mut out);
    assert_eq!(count(&out, &Event::OrphanFound), 0, "{out:?}");
    assert_eq!(count(&out, &Event::Ended(Outcome::Lapsed)), 0, "{out:?}");
    assert_eq!(count(&out, &Event::Ended(Outcome::Swapped)), 1, "{out:?}");

    // Past the grace, the same sighting is an orphan at once.
    let mut tracker = Tracker::new(rules());
    let mut out = feed(&mut tracker, &mig.docs[..2]);
    tracker.observe(&write, at(76), Seen::Scan, &mut out);
    assert_eq!(count(&out, &Event::OrphanFound), 1, "{out:?}");
}

#[test]
fn a_release_within_the_grace_of_the_lease_end_is_a_release() {
    // The hardDelete lease ends at 115 s; the holder, its clock a little behind,
    // releases at 116 s by the store's.
    let mig = migration(15, 40, 52);
    let released = lifecycle::release(&mig.docs[1].0, &mig.token, at(100)).unwrap();
    let mut tracker = Tracker::new(rules());
    let mut out = feed(&mut tracker, &mig.docs[..2]);
    tracker.observe(&released, at(116), Seen::Stream, &mut out);
    assert_eq!(count(&out, &Event::Ended(Outcome::Released)), 1, "{out:?}");
    assert_eq!(held(&out, Phase::HardDelete), [100 * S], "the hold ends with the lease");
}

/// A migration like [`migration`]'s first three versions (never swapped), with `owner`.
fn abandoned_by(owner: &str, id: &str) -> Vec<(LocationDocument, DateTime<Utc>)> {
    let doc = LocationDocument::new(id, "westeurope");
    let token = LockToken::generate();
    let request = PreLockRequest { owner: owner.into(), ..req() };
    let pre = lifecycle::pre_lock(&doc, &request, token.clone(), &policy(), at(0)).unwrap();
    let hard = lifecycle::escalate(&pre, &token, Phase::HardDelete, 100 * S, &policy(), at(15)).unwrap();
    let write = lifecycle::escalate(&hard, &token, Phase::Write, 30 * S, &policy(), at(40)).unwrap();
    vec![(pre, at(0)), (hard, at(15)), (write, at(40))]
}

#[test]
fn the_owner_says_whose_lock_it_is() {
    assert_eq!(Source::of_owner("lockprobe/demo"), Source::Probe);
    assert_eq!(Source::of_owner("lockprobe/demo#3"), Source::Probe, "the concurrent pre-lock check's owners");
    for fleet in ["orchestrator-1", "lockprobe", "lockprobe demo", "xlockprobe/demo", ""] {
        assert_eq!(Source::of_owner(fleet), Source::Fleet, "{fleet:?}");
    }
}

#[test]
fn a_probe_lock_that_lapses_is_counted_apart_from_the_fleets_orphans() {
    let mut tracker = Tracker::new(rules());
    let mut out = Vec::new();
    for (doc, when) in abandoned_by("lockprobe/demo", "probe-0001") {
        assert_eq!(tracker.observe(&doc, when, Seen::Stream, &mut out), Source::Probe);
    }
    for (doc, when) in abandoned_by("orch", "r9") {
        assert_eq!(tracker.observe(&doc, when, Seen::Stream, &mut out), Source::Fleet);
    }
    assert_eq!((tracker.in_flight_of(Source::Probe), tracker.in_flight_of(Source::Fleet)), (1, 1));
    let mut found = Vec::new();
    tracker.sweep(at(80), &mut found);
    let lapsed: Vec<(String, Source)> = found
        .iter()
        .filter(|(_, e)| *e == Event::Ended(Outcome::Lapsed))
        .map(|(id, _)| (id.clone(), tracker.source_of(id)))
        .collect();
    assert_eq!(lapsed.len(), 2);
    assert!(lapsed.contains(&("probe-0001".into(), Source::Probe)), "{lapsed:?}");
    assert!(lapsed.contains(&("r9".into(), Source::Fleet)), "{lapsed:?}");
    assert_eq!(tracker.orphans(), 1, "only the fleet's lock is the fleet's orphan");
    assert_eq!(tracker.orphans_of(Source::Probe), 1);
    assert_eq!(tracker.orphan_ids(10), ["r9"]);
    assert_eq!((tracker.in_flight(), tracker.in_flight_of(Source::Probe)), (0, 0));

    // The probe's next cycle on that resource pre-locks over its expired lock: the
    // orphan clears, a new probe migration starts.
    let expired = abandoned_by("lockprobe/demo", "probe-0001").pop().unwrap().0;
    let request = PreLockRequest { owner: "lockprobe/demo".into(), ..req() };
    let retry = lifecycle::pre_lock(&expired, &request, LockToken::generate(), &policy(), at(90)).unwrap();
    let mut out = Vec::new();
    // (A fresh document with an expired lock of the same owner: the tracker knows the
    // resource from the sweep, so the new lock replaces it.)
    tracker.observe(&retry, at(90), Seen::Stream, &mut out);
    assert!(out.contains(&Event::OrphanCleared), "{out:?}");
    assert_eq!((tracker.orphans_of(Source::Probe), tracker.in_flight_of(Source::Probe)), (0, 1));
    assert_eq!(tracker.in_flight_of(Source::Fleet), 0);
}

#[test]
fn a_forgotten_migration_leaves_every_count_and_is_never_judged() {
    // In flight, lapsed (an orphan) and ended: forgetting each gives back its count.
    let live = migration(15, 40, 52);
    let mut tracker = Tracker::new(rules());
    feed(&mut tracker, &live.docs[..2]);
    assert_eq!(tracker.in_flight(), 1);
    assert!(tracker.forget("r1"));
    assert_eq!((tracker.in_flight(), tracker.orphans(), tracker.retained()), (0, 0, 0));
    let mut found = Vec::new();
    tracker.sweep(at(10_000), &mut found);
    assert!(found.is_empty(), "a forgotten lock lapses unseen: {found:?}");
    assert!(!tracker.forget("r1"), "nothing left to forget");

    feed(&mut tracker, &live.docs[..3]);
    tracker.sweep(at(75), &mut found);
    assert_eq!(tracker.orphans(), 1);
    assert!(tracker.forget("r1"));
    assert_eq!((tracker.in_flight(), tracker.orphans(), tracker.retained()), (0, 0, 0));

    feed(&mut tracker, &live.docs);
    assert_eq!((tracker.in_flight(), tracker.retained()), (0, 1), "the swap is remembered for the grace");
    assert!(tracker.forget("r1"));
    assert_eq!((tracker.in_flight(), tracker.retained()), (0, 0));

    // The probe's own lock: its live count goes too.
    let doc = LocationDocument::new("probe-1", "westeurope");
    let probe = PreLockRequest { owner: format!("{PROBE_OWNER_PREFIX}t"), ..req() };
    let pre = lifecycle::pre_lock(&doc, &probe, LockToken::generate(), &policy(), at(0)).unwrap();
    feed(&mut tracker, &[(pre, at(0))]);
    assert_eq!(tracker.in_flight_of(Source::Probe), 1);
    assert!(tracker.forget("probe-1"));
    assert_eq!((tracker.in_flight_of(Source::Probe), tracker.in_flight()), (0, 0));
}

#[test]
fn a_full_table_follows_what_it_holds_and_says_what_it_refused() {
    // One 64 KiB chunk of ids: room for a few migrations with 20 KiB ids.
    let mut tracker = Tracker::with_table(rules(), crate::monitor::table::TimelineTable::with_max_chunks(1));
    let mut events = Vec::new();
    let mut refused = 0;
    for i in 0..5 {
        let doc = LocationDocument::new(format!("{i}{}", "r".repeat(20_000)), "westeurope");
        let locked = lifecycle::pre_lock(&doc, &req(), LockToken::generate(), &policy(), t0()).unwrap();
        events.clear();
        tracker.observe(&locked, t0(), Seen::Stream, &mut events);
        if events == [Event::Untracked] {
            refused += 1;
        } else {
            assert_eq!(events, [Event::Started], "{i}");
        }
    }
    assert_eq!((tracker.in_flight(), refused), (3, 2));
    // The migrations it holds are still judged to the end.
    let doc = LocationDocument::new(format!("0{}", "r".repeat(20_000)), "westeurope");
    events.clear();
    tracker.observe(&doc, at(20), Seen::Stream, &mut events);
    assert!(events.contains(&Event::Ended(Outcome::Released)), "{events:?}");
    assert_eq!(tracker.in_flight(), 2);
}

/// The lock's hardDelete escalation at 15 s, then a version without it at `gone` whose
/// `forceReleases` holds an approval at `approved` (or none).
fn force_released(approved: Option<u64>, gone: u64) -> Vec<(LocationDocument, DateTime<Utc>)> {
    use crate::routing::force_release::{decide, AdminCall, ForceReleaseRequest};
    use crate::routing::lifecycle::Decided;
    let mig = migration(15, 40, 52);
    let hard = mig.docs[1].0.clone();
    let mut docs = vec![mig.docs[0].clone(), mig.docs[1].clone()];
    let written = |doc: &LocationDocument, call: &AdminCall, t: u64| match decide(doc, call, &policy(), at(t)).unwrap()
    {
        Decided::Write(next) => *next,
        Decided::Replayed => unreachable!(),
    };
    let gone_doc = match approved {
        Some(t) => {
            let request = AdminCall::Request(ForceReleaseRequest {
                id: "req".into(),
                lock: mig.token.digest(),
                phase: Phase::HardDelete,
                requested_by: "alice".into(),
                reason: "holder lost".into(),
            });
            let asked = written(&hard, &request, t - 1);
            written(&asked, &AdminCall::Approve { id: "req".into(), principal: "bob".into() }, t)
        }
        None => lifecycle::release(&hard, &mig.token, at(gone)).unwrap(),
    };
    docs.push((gone_doc, at(gone)));
    docs
}

#[test]
fn a_force_release_is_counted_apart_from_releases_with_who_and_why() {
    let events = feed(&mut Tracker::new(rules()), &force_released(Some(30), 30));
    assert_eq!(count(&events, &Event::Ended(Outcome::ForceReleased)), 1, "{events:?}");
    assert_eq!(count(&events, &Event::Ended(Outcome::Released)), 0);
    assert!(events.contains(&Event::ForceReleased {
        request: "req".into(),
        requested_by: "alice".into(),
        approved_by: "bob".into(),
        reason: "holder lost".into(),
    }));
    assert_eq!(held(&events, Phase::HardDelete), [15 * S], "the phase ends at the approval");
    // A release by the holder is still a release.
    let events = feed(&mut Tracker::new(rules()), &force_released(None, 30));
    assert_eq!(count(&events, &Event::Ended(Outcome::Released)), 1);
    assert!(!events.iter().any(|e| matches!(e, Event::ForceReleased { .. })));
}
