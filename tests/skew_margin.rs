//! One rule in the skew margin (contract 1.3): after a write lease ends, every instance
//! keeps refusing writes until the end plus the margin by its own clock, and no new
//! pre-lock, granted by an instance whose clock runs ahead or behind, cuts that short.
//! Both lock designs, one instance skewed each way, on tokio's paused clock.

#[path = "support/fleet.rs"]
mod fleet;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use fleet::{Answer, Fleet, FleetOptions};
use lockprobe::service::LockDesign;
use serde_json::json;

const MARGIN: Duration = Duration::from_millis(500);
/// How far instance 1 runs off true time: inside the margin, as the contract assumes.
const SKEW_MS: i64 = 400;
const STEP: TimeDelta = TimeDelta::milliseconds(25);

fn token(a: &Answer) -> String {
    assert_eq!(a.status, 201, "expected a granted pre-lock: {:?}", a.body);
    a.field("token").unwrap().to_owned()
}

/// Takes `id` to the write phase with a short lease through instance 0; returns the
/// lease's end.
async fn write_locked(f: &Fleet, id: &str) -> DateTime<Utc> {
    let pre = f.pre_lock(0, id, "pre", 60.0, None).await;
    let t = token(&pre);
    f.until(pre.time("effectiveAt").unwrap() + TimeDelta::milliseconds(1)).await;
    let hd = f.escalate(0, id, "hd", &t, "hardDelete", 30.0).await;
    assert_eq!(hd.status, 200, "{:?}", hd.body);
    let w = f.escalate(0, id, "w", &t, "write", 1.0).await;
    assert_eq!(w.status, 200, "{:?}", w.body);
    w.time("expiresAt").unwrap()
}

/// From just before the lease's end until well past it, every step: a new pre-lock
/// through the skewed instance (until one is granted) and a user write through each
/// instance. A write accepted by an instance whose own clock still read the lease's end
/// plus the margin is the violation. Returns when the new lock was granted (true time).
async fn walk_past_the_end(design: LockDesign, skew_ms: i64) -> DateTime<Utc> {
    let f = Fleet::new(FleetOptions {
        skews: vec![TimeDelta::zero(), TimeDelta::milliseconds(skew_ms)],
        skew_margin: MARGIN,
        lock_design: design,
        ..FleetOptions::default()
    });
    let end = write_locked(&f, "r").await;
    let margin = TimeDelta::from_std(MARGIN).unwrap();
    let skews = [TimeDelta::zero(), TimeDelta::milliseconds(skew_ms)];
    let mut granted = None;
    let mut at = end - TimeDelta::milliseconds(100);
    let mut n = 0;
    while at < end + margin * 4 {
        f.until(at).await;
        if granted.is_none() {
            let pre = f.pre_lock(1, "r", &format!("next-{n}"), 60.0, None).await;
            match pre.status {
                201 => granted = Some(f.now()),
                423 => {}
                other => panic!("pre-lock answered {other}: {:?}", pre.body),
            }
        }
        for (i, skew) in skews.iter().enumerate() {
            let sent = f.now();
            let answer = f.write(i, "r", &format!("k{n}-{i}"), json!(n)).await;
            let own_clock = sent + *skew;
            if (200..300).contains(&answer.status) {
                assert!(
                    own_clock >= end + margin,
                    "{} skew {skew_ms} ms: instance {i} accepted a write at its own {} ms after the lease's end, \
                     inside its margin (new lock granted at {:?})",
                    design.as_str(),
                    (own_clock - end).num_milliseconds(),
                    granted.map(|g| (g - end).num_milliseconds()),
                );
            }
        }
        at += STEP;
        n += 1;
    }
    let granted = granted.expect("a new pre-lock is granted once every margin has passed");
    // Not later than needed: twice the margin by the granting instance's clock.
    let by_its_clock = granted + TimeDelta::milliseconds(skew_ms) - end;
    assert!(
        by_its_clock < margin * 2 + STEP * 2,
        "granted {} ms after the end by its clock",
        by_its_clock.num_milliseconds()
    );
    granted
}

#[tokio::test(start_paused = true)]
async fn a_new_lock_granted_by_a_clock_ahead_never_cuts_another_instances_margin_short() {
    for design in [LockDesign::Embedded, LockDesign::Record] {
        walk_past_the_end(design, SKEW_MS).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_lock_granted_by_a_clock_behind_never_cuts_another_instances_margin_short() {
    for design in [LockDesign::Embedded, LockDesign::Record] {
        walk_past_the_end(design, -SKEW_MS).await;
    }
}
