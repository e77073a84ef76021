//! The three ways slow, late and ambiguous store writes broke the lock (the store-faults
//! issue), each replayed through the reference service's handlers with the store fault
//! that caused it. Each scenario runs twice: with the legacy behaviour switched back on
//! it shows the hole (the regression as it was), and as shipped it holds. Plus the
//! suspected race of two swaps with one token, settled.
//!
//! Time is tokio's paused clock (`start_paused`): the seconds below are virtual.

#[path = "support/fleet.rs"]
mod fleet;

use std::time::Duration;

use chrono::TimeDelta;
use fleet::{Answer, Fleet, FleetOptions};
use lockprobe::document::lock_record_id;
use lockprobe::service::{Fault, LockDesign};
use lockprobe::store::{LocationStore, OpKind, ReadFrom};
use lockprobe::testing::{FaultKind, FaultRule};
use serde_json::json;

const ID: &str = "r";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn rule(spec: &str) -> FaultRule {
    spec.parse().unwrap()
}

fn token(a: &Answer) -> String {
    a.field("token").unwrap_or_else(|| panic!("no token in {:?}", a.body)).to_owned()
}

/// What scenario 1 saw on the stale instance: the delete during hardDelete, the write
/// during the write lock, and whether a write acknowledged right after the swap survived.
struct LatePreLock {
    delete: u16,
    write: u16,
    post_swap_write: u16,
    post_swap_read: u16,
}

/// Scenario 1: the pre-lock's write lands 3 s after it was decided; instance 1 read the
/// document just before it landed; the orchestrator escalates as soon as the lock view
/// says it may (`effectiveAt`), then goes through hardDelete, write and the swap.
async fn late_pre_lock(faults: Vec<Fault>) -> LatePreLock {
    let f = Fleet::new(FleetOptions { faults, ..FleetOptions::default() });
    assert_eq!(f.write(1, ID, "doomed", json!(1)).await.status, 201);
    assert_eq!(f.write(1, ID, "kept", json!(1)).await.status, 201);
    tokio::time::sleep(Duration::from_secs(3)).await; // replicas have the document
    f.store.add_rule(rule("replace:delay=3s x1"));
    let pre = {
        let orchestrator = f.pre_lock(0, ID, "pre", 600.0, Some("northeurope"));
        let stale_read = async {
            // Just before the pre-lock lands: instance 1 caches the unlocked document.
            tokio::time::sleep(ms(2_900)).await;
            assert!(f.route(1, ID).await.body["lock"].is_null());
        };
        let (pre, ()) = tokio::join!(orchestrator, stale_read);
        pre
    };
    assert_eq!(pre.status, 201, "{:?}", pre.body);
    let tok = token(&pre);
    // An eager orchestrator escalates at the instant the service said it may.
    f.until(pre.time("effectiveAt").unwrap()).await;
    assert_eq!(f.escalate(0, ID, "hd", &tok, "hardDelete", 60.0).await.status, 200);
    let delete = f.delete(1, ID, "doomed").await.status;
    assert_eq!(f.escalate(0, ID, "w", &tok, "write", 30.0).await.status, 200);
    let write = f.write(1, ID, "kept", json!(2)).await.status;
    let swap = f.swap(0, ID, "s", &tok, "northeurope").await;
    assert_eq!(swap.status, 200, "{:?}", swap.body);
    let post_swap_write = f.write(1, ID, "after", json!("acknowledged")).await.status;
    // Once every cache has converged on the new location, is the acknowledged write there?
    tokio::time::sleep(Duration::from_secs(5)).await;
    let post_swap_read = f.read(0, ID, "after").await.status;
    LatePreLock { delete, write, post_swap_write, post_swap_read }
}

#[tokio::test(start_paused = true)]
async fn a_late_pre_lock_with_the_legacy_effective_at_lets_a_stale_instance_break_every_phase() {
    let seen = late_pre_lock(vec![Fault::LegacyEffectiveAt]).await;
    assert_eq!(seen.delete, 204, "the delete during hardDelete was physical");
    assert!(matches!(seen.write, 200 | 201), "the write during the write lock was accepted: {}", seen.write);
    assert_eq!(seen.post_swap_write, 201);
    assert_eq!(seen.post_swap_read, 404, "the write acknowledged after the swap was lost");
}

#[tokio::test(start_paused = true)]
async fn a_late_pre_lock_restricts_from_its_commit_and_nothing_is_lost() {
    let seen = late_pre_lock(Vec::new()).await;
    assert_eq!(seen.delete, 202, "tombstoned");
    assert_eq!(seen.write, 423, "blocked");
    assert_eq!(seen.post_swap_write, 201);
    assert_eq!(seen.post_swap_read, 200, "the acknowledged write is at the new location");
}

/// What scenario 2 saw: the holder's answer to the late renewal, and a write on each
/// instance after it.
struct LateRenewal {
    holder: u16,
    write_fresh: u16,
    write_stale: u16,
}

/// Scenario 2: a write-lease renewal decided 0.2 s before the lease ends lands 1.2 s
/// after it; instance 1 read the document after the lapse (by more than the skew margin)
/// and took the lapse as final.
async fn late_renewal(faults: Vec<Fault>) -> LateRenewal {
    let f = Fleet::new(FleetOptions { faults, ..FleetOptions::default() });
    let pre = f.pre_lock(0, ID, "pre", 600.0, None).await;
    let tok = token(&pre);
    f.until(pre.time("effectiveAt").unwrap()).await;
    assert_eq!(f.escalate(0, ID, "hd", &tok, "hardDelete", 60.0).await.status, 200);
    let write_lock = f.escalate(0, ID, "w", &tok, "write", 2.0).await;
    let ends = write_lock.time("expiresAt").unwrap();
    f.until(ends - TimeDelta::milliseconds(200)).await;
    f.store.add_rule(rule("replace:delay=1200ms x1"));
    let renewal = f.renew(0, ID, "renew", &tok, 30.0);
    let stale_read = async {
        // After the lapse, by more than the margin: instance 1 caches it as final.
        f.until(ends + TimeDelta::milliseconds(700)).await;
        let _ = f.write(1, ID, "probe", json!(0)).await;
    };
    let (holder, ()) = tokio::join!(renewal, stale_read);
    LateRenewal {
        holder: holder.status,
        write_fresh: f.write(0, ID, "k", json!(1)).await.status,
        write_stale: f.write(1, ID, "k", json!(2)).await.status,
    }
}

#[tokio::test(start_paused = true)]
async fn a_late_renewal_with_the_legacy_rule_resurrects_a_lease_one_instance_has_seen_end() {
    let seen = late_renewal(vec![Fault::LegacyRenewal]).await;
    assert_eq!(seen.holder, 200, "the holder is told it still holds the lock");
    assert_eq!(seen.write_fresh, 423, "the lock is in force again");
    assert_eq!(seen.write_stale, 201, "and a stale instance accepts writes under it");
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_lands_after_its_lease_is_void_and_the_holder_hears_so() {
    let seen = late_renewal(Vec::new()).await;
    assert_eq!(seen.holder, 410, "lock-expired: the renewal took no effect");
    assert_eq!(seen.write_fresh, 201, "no lock is in force on the fresh instance");
    assert_eq!(seen.write_stale, 200, "nor on the stale one (the item exists now)");
}

/// Scenario 3: the store times out the pre-lock's write at 2 s and commits it at 3 s.
#[tokio::test(start_paused = true)]
async fn an_ambiguous_pre_lock_is_outcome_unknown_and_its_repeat_returns_the_granted_lock() {
    let f = Fleet::new(FleetOptions::default());
    f.write(0, ID, "k", json!(1)).await;
    f.store.add_rule(rule("replace:late-commit=3s,timeout=2s x1"));
    let first = f.pre_lock(0, ID, "key-1", 600.0, None).await;
    assert_eq!((first.status, first.problem()), (503, Some("outcome-unknown")), "{:?}", first.body);
    assert!(first.retry_after.is_some());
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The repeat may reach any instance.
    let again = f.pre_lock(1, ID, "key-1", 600.0, None).await;
    assert_eq!(again.status, 201, "{:?}", again.body);
    let tok = token(&again);
    assert_eq!(
        f.pre_lock(1, ID, "key-1", 600.0, None).await.field("token"),
        Some(tok.as_str()),
        "the same token again"
    );
    assert_eq!(f.pre_lock(0, ID, "someone-else", 600.0, None).await.status, 423);
    assert_eq!(f.release(1, ID, "rel", &tok).await.status, 204, "the holder can release: nothing is orphaned");
    assert_eq!(f.pre_lock(0, ID, "key-1", 600.0, None).await.status, 409, "a released key never grants a fresh lock");
}

/// Scenario 3 against a service that ignores keys (contract 1.0): the repeat cannot learn
/// the outcome, and the lock it cannot see stays until its lease ends.
#[tokio::test(start_paused = true)]
async fn an_ambiguous_pre_lock_without_keys_leaves_a_lock_nobody_can_release() {
    let f = Fleet::new(FleetOptions { faults: vec![Fault::IgnoreIdempotencyKey], ..FleetOptions::default() });
    f.write(0, ID, "k", json!(1)).await;
    f.store.add_rule(rule("replace:late-commit=3s,timeout=2s x1"));
    assert_eq!(f.pre_lock(0, ID, "key-1", 600.0, None).await.problem(), Some("outcome-unknown"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = f.pre_lock(0, ID, "key-1", 600.0, None).await;
    assert_eq!(again.status, 423, "{:?}", again.body);
    assert!(again.retry_after.unwrap() > 500, "held for the whole lease: {:?}", again.retry_after);
}

/// The suspected race: two swaps with the same token (two orchestrator replicas, say).
/// The second reads the document before the first swaps, and its answer arrives late;
/// meanwhile the first swaps and a user writes at the new location. The second's copy
/// must not overwrite that write.
#[tokio::test(start_paused = true)]
async fn a_second_swap_of_the_same_lock_never_overwrites_writes_made_after_the_first() {
    let f = Fleet::new(FleetOptions::default());
    f.write(0, ID, "k", json!("before")).await;
    let pre = f.pre_lock(0, ID, "pre", 600.0, Some("northeurope")).await;
    let tok = token(&pre);
    f.until(pre.time("effectiveAt").unwrap()).await;
    f.escalate(0, ID, "hd", &tok, "hardDelete", 60.0).await;
    assert_eq!(f.escalate(0, ID, "w", &tok, "write", 60.0).await.status, 200);
    f.store.add_rule(rule("read_write_region:late-ack=4s x1"));
    let second = f.swap(1, ID, "swap-b", &tok, "northeurope");
    let first_then_user = async {
        tokio::time::sleep(ms(10)).await;
        let first = f.swap(0, ID, "swap-a", &tok, "northeurope").await;
        assert_eq!(first.status, 200, "{:?}", first.body);
        assert_eq!(f.write(0, ID, "k", json!("after")).await.status, 200);
    };
    let (second, ()) = tokio::join!(second, first_then_user);
    assert_eq!((second.status, second.problem()), (409, Some("token-mismatch")), "{:?}", second.body);
    assert_eq!(f.read(1, ID, "k").await.body["value"], "after", "the write made after the first swap survives");
}

/// Found by the model checker: an instance caches the document its own write produced
/// when the answer arrives. If the answer is late, the cached (lock-free) document looked
/// younger than it was, and was served while another orchestrator had locked and
/// escalated meanwhile. The entry must age from before the write was sent.
#[tokio::test(start_paused = true)]
async fn a_late_acknowledged_release_is_not_cached_as_fresh() {
    let f = Fleet::new(FleetOptions::default());
    assert_eq!(f.write(0, ID, "k", json!(1)).await.status, 201);
    let first = f.pre_lock(0, ID, "first", 600.0, None).await;
    f.until(first.time("effectiveAt").unwrap()).await;
    f.store.add_rule(rule("replace:late-ack=5s x1"));
    let first_token = token(&first);
    let release = f.release(0, ID, "release", &first_token);
    let second = async {
        tokio::time::sleep(ms(100)).await;
        let second = f.pre_lock(1, ID, "second", 600.0, None).await;
        assert_eq!(second.status, 201, "{:?}", second.body);
        f.until(second.time("effectiveAt").unwrap()).await;
        assert_eq!(f.escalate(1, ID, "hd", &token(&second), "hardDelete", 60.0).await.status, 200);
    };
    let (released, ()) = tokio::join!(release, second);
    assert_eq!(released.status, 204);
    let delete = f.delete(0, ID, "k").await;
    assert_eq!(delete.status, 202, "tombstoned under the second migration's hardDelete lock: {:?}", delete.body);
}

/// The lock-record design (`--lock-design record`) swaps with two writes: the lock
/// record (which carries the location), then the routing document. These take the
/// service down or fault the store between them.
fn record_fleet() -> Fleet {
    Fleet::new(FleetOptions { lock_design: LockDesign::Record, ..FleetOptions::default() })
}

/// Takes `ID` through a pre-lock towards `to`, hardDelete and write, under keys that
/// start with `migration`: the token.
async fn to_write_lock(f: &Fleet, migration: &str, to: &str) -> String {
    let pre = f.pre_lock(0, ID, &format!("{migration}-pre"), 600.0, Some(to)).await;
    assert_eq!(pre.status, 201, "{:?}", pre.body);
    let tok = token(&pre);
    f.until(pre.time("effectiveAt").unwrap()).await;
    assert_eq!(f.escalate(0, ID, &format!("{migration}-hd"), &tok, "hardDelete", 60.0).await.status, 200);
    assert_eq!(f.escalate(0, ID, &format!("{migration}-w"), &tok, "write", 60.0).await.status, 200);
    tok
}

/// Where the store's own copy of `id` says the resource is.
async fn stored_location(f: &Fleet, id: &str) -> String {
    f.store.read(id, ReadFrom::WriteRegion).await.unwrap().doc.primary.location
}

/// Every instance routes `ID` to `at`, and a write acknowledged on one instance is there
/// and is what the other reads.
async fn assert_every_instance_acts_on(f: &Fleet, at: &str, value: &str) {
    for i in 0..f.instances() {
        let route = f.route(i, ID).await;
        assert_eq!(route.body["location"], at, "instance {i}: {:?}", route.body);
    }
    let written = f.write(1, ID, "k", json!(value)).await;
    assert!(matches!(written.status, 200 | 201), "{:?}", written.body);
    assert_eq!(f.items.get(at, ID, "k").map(|item| item.value), Some(json!(value)), "written at {at}");
    assert_eq!(f.read(0, ID, "k").await.body["value"], value);
}

/// The routing document's write fails after the lock record's committed. The swap has
/// taken effect (every instance routes by the lock record), so it is answered as done,
/// not with `store-unavailable` ("nothing was changed"), which would tell a client
/// to act as if the resource were still at its source. A repeat under the key moves
/// the routing document.
#[tokio::test(start_paused = true)]
async fn record_design_a_swap_whose_routing_document_write_fails_has_taken_effect() {
    let f = record_fleet();
    assert_eq!(f.write(0, ID, "k", json!("before")).await.status, 201);
    let tok = to_write_lock(&f, "m1", "northeurope").await;
    f.store.add_rule(rule(&format!("replace:fail x1 id={ID} step=swap")));
    let swap = f.swap(0, ID, "m1-swap", &tok, "northeurope").await;
    assert_eq!((swap.status, swap.problem()), (200, None), "{:?}", swap.body);
    assert_eq!(swap.body["location"], "northeurope");
    assert_eq!(f.store.stats().injected(OpKind::Replace, FaultKind::Fail), 1, "the fault struck");
    assert_eq!(stored_location(&f, &lock_record_id(ID)).await, "northeurope");
    assert_eq!(stored_location(&f, ID).await, "westeurope", "the routing document was left behind");
    assert_every_instance_acts_on(&f, "northeurope", "after").await;

    let again = f.swap(1, ID, "m1-swap", &tok, "northeurope").await;
    assert_eq!((again.status, again.body["location"].clone()), (200, json!("northeurope")), "{:?}", again.body);
    assert_eq!(stored_location(&f, ID).await, "northeurope", "the repeat moved the routing document");
    assert_every_instance_acts_on(&f, "northeurope", "again").await;
}

/// The instance dies between the two writes (its request is dropped while the routing
/// document's write is held up): nothing is lost and nobody acts on the routing document
/// left behind; the orchestrator's repeat under its key finishes the move.
#[tokio::test(start_paused = true)]
async fn record_design_a_swap_killed_between_its_two_writes_is_finished_by_its_repeat() {
    let f = record_fleet();
    assert_eq!(f.write(0, ID, "k", json!("before")).await.status, 201);
    let tok = to_write_lock(&f, "m1", "northeurope").await;
    f.store.add_rule(rule(&format!("replace:delay=1h x1 id={ID} step=swap")));
    let killed = tokio::time::timeout(Duration::from_secs(60), f.swap(0, ID, "m1-swap", &tok, "northeurope")).await;
    assert!(killed.is_err(), "the swap was still waiting for the routing document's write: {killed:?}");
    assert_eq!(stored_location(&f, &lock_record_id(ID)).await, "northeurope");
    assert_eq!(stored_location(&f, ID).await, "westeurope", "the routing document was left behind");
    assert_every_instance_acts_on(&f, "northeurope", "after").await;

    let again = f.swap(1, ID, "m1-swap", &tok, "northeurope").await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(stored_location(&f, ID).await, "northeurope");
}

/// A repeat of a swap that left its routing document behind, arriving after a later
/// migration moved the resource back, must not move the routing document to the old
/// swap's target: it follows the lock record.
#[tokio::test(start_paused = true)]
async fn record_design_a_late_repeat_of_an_old_swap_never_moves_the_routing_document_back() {
    let f = record_fleet();
    assert_eq!(f.write(0, ID, "k", json!("before")).await.status, 201);
    let first = to_write_lock(&f, "m1", "northeurope").await;
    f.store.add_rule(rule(&format!("replace:fail x1 id={ID} step=swap")));
    f.swap(0, ID, "m1-swap", &first, "northeurope").await;
    assert_eq!(stored_location(&f, ID).await, "westeurope", "the routing document was left behind");

    let second = to_write_lock(&f, "m2", "westeurope").await;
    assert_eq!(f.swap(0, ID, "m2-swap", &second, "westeurope").await.status, 200);
    let late = f.swap(1, ID, "m1-swap", &first, "northeurope").await;
    assert_eq!(late.status, 200, "a replay: {:?}", late.body);
    assert_eq!(stored_location(&f, &lock_record_id(ID)).await, "westeurope");
    assert_eq!(stored_location(&f, ID).await, "westeurope", "the routing document follows the lock record");
    assert_every_instance_acts_on(&f, "westeurope", "after").await;
}

/// The first swap's routing-document write is held up in the store until a second
/// migration has moved the resource back (and found the routing document where it
/// wanted it, so wrote nothing). The held write then lands; the first swap must not
/// leave the routing document at its own, now stale, target.
#[tokio::test(start_paused = true)]
async fn record_design_a_routing_document_write_overtaken_by_a_later_swap_is_corrected() {
    let f = record_fleet();
    assert_eq!(f.write(0, ID, "k", json!("before")).await.status, 201);
    let first = to_write_lock(&f, "m1", "northeurope").await;
    f.store.add_rule(rule(&format!("replace:delay=30s x1 id={ID} step=swap")));
    let first_swap = f.swap(0, ID, "m1-swap", &first, "northeurope");
    let second_migration = async {
        while stored_location(&f, &lock_record_id(ID)).await != "northeurope" {
            tokio::time::sleep(ms(10)).await;
        }
        let second = to_write_lock(&f, "m2", "westeurope").await;
        assert_eq!(f.swap(1, ID, "m2-swap", &second, "westeurope").await.status, 200);
        f.now()
    };
    let (first_swap, second_done) = tokio::join!(first_swap, second_migration);
    assert_eq!(first_swap.status, 200, "{:?}", first_swap.body);
    assert!(second_done < f.now(), "the second migration finished while the first swap's write was held up");
    assert_eq!(stored_location(&f, &lock_record_id(ID)).await, "westeurope");
    assert_eq!(stored_location(&f, ID).await, "westeurope", "the routing document follows the lock record");
    assert_every_instance_acts_on(&f, "westeurope", "after").await;
}
