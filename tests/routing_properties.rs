//! Property tests of the lock protocol: random interleavings of two to four
//! orchestrators (each a `RoutingClient` with its own cache) over one in-memory store
//! and one manual clock, with injected 412s, a concurrent writer, forward clock jumps
//! and backward steps of up to the skew margin (the step the design absorbs). After
//! every step the store's write-region document and its whole change history are
//! checked against the invariants of the lock protocol:
//!
//! - at most one live token per resource (no new token while a live lock exists; at most
//!   one orchestrator's token is accepted at any instant; a swap's guard on `secondary`
//!   keeps the old token but no operation accepts it);
//! - no committed change without the current ETag (each commit's If-Match is its
//!   predecessor's ETag, and the ETag its writer last read) and, for lock operations,
//!   without the current live token; a refused operation commits nothing;
//! - location and lock never change separately (a swap is all or nothing);
//! - an expired token can do nothing;
//! - no `expiresAt` past `preLockExpiresAt` or `maxExpiresAt`;
//! - a declared target stays locked as long as the migration's lock, and a swap's
//!   guard on the old location is not dropped while live (in true elapsed time);
//! - resolve never serves a stale document while a lock is in force, and its `Source`
//!   matches the store reads it made.
//!
//! Every store call of a client goes through [`Observed`], which records what the
//! client read and which ETag each of its writes presented, so the history can be
//! judged without trusting the client's own account of it.

#[path = "support/stores.rs"]
mod stores;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;

use lockprobe::clock::{to_chrono, Clock, ManualClock};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::lifecycle;
use lockprobe::routing::{
    ClientOptions, LocationDocument, LockError, LockInfo, LockPolicy, LockToken, Phase, PreLockRequest, RoutingClient,
    RoutingError, Source,
};
use lockprobe::store::memory::MemoryStoreConfig;
use lockprobe::store::OpKind;
use lockprobe::store::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Versioned,
};
use lockprobe::testing::FaultAction;

const ID: &str = "res-1";
const REGIONS: [&str; 3] = ["westeurope", "northeurope", "eastus"];
const TTLS: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(5)];
const LAG: Duration = Duration::from_secs(5);
const MAX_PRE_LOCK: Duration = Duration::from_secs(120);
const BUDGET: u32 = 3;
/// The clients' clock-skew margin.
const SKEW_MS: u64 = 500;
/// The `who` of the concurrent writer that is not an orchestrator.
const INTERFERER: usize = usize::MAX;
/// The unknown field the concurrent writer bumps; every rewrite must keep it.
const TOUCH: &str = "touchedBy3rdParty";

#[derive(Debug, Clone)]
enum Event {
    /// A write-region read and the ETag it returned.
    Read { who: usize, etag: ETag },
    /// A committed replace and the ETag it presented.
    Committed { who: usize, if_match: ETag, etag: ETag },
}

type Log = Arc<Mutex<Vec<Event>>>;

/// One orchestrator's view of the shared store: forwards every call and records it.
#[derive(Debug)]
struct Observed {
    inner: Arc<dyn LocationStore>,
    who: usize,
    log: Log,
    /// Replaces still to be preceded by a concurrent writer's change.
    interfere: AtomicU32,
}

impl Observed {
    fn push(&self, e: Event) {
        self.log.lock().unwrap().push(e);
    }

    /// A third party (say, a newer library version adding its own field) changes the
    /// document between this client's read and its replace. Like every writer that
    /// knows the pending effect of the last write, it stores the settled document.
    async fn interfere_once(&self, id: &str) {
        let Ok(cur) = self.inner.read(id, ReadFrom::WriteRegion).await else { return };
        self.push(Event::Read { who: INTERFERER, etag: cur.etag.clone() });
        let mut doc = lifecycle::settle(cur.doc.clone(), cur.committed_at);
        let n = doc.extra.get(TOUCH).and_then(Value::as_u64).unwrap_or(0);
        doc.extra.insert(TOUCH.into(), Value::from(n + 1));
        if let Ok(committed) = self.inner.replace(&doc, &cur.etag).await {
            self.push(Event::Committed { who: INTERFERER, if_match: cur.etag, etag: committed.etag });
        }
    }
}

#[async_trait]
impl LocationStore for Observed {
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        let r = self.inner.read(id, from).await;
        if let (Ok(v), ReadFrom::WriteRegion) = (&r, from) {
            self.push(Event::Read { who: self.who, etag: v.etag.clone() });
        }
        r
    }

    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        self.inner.create(doc).await
    }

    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        if self.interfere.load(Ordering::SeqCst) > 0 {
            self.interfere.fetch_sub(1, Ordering::SeqCst);
            self.interfere_once(&doc.id).await;
        }
        let r = self.inner.replace(doc, if_match).await;
        if let Ok(committed) = &r {
            self.push(Event::Committed { who: self.who, if_match: if_match.clone(), etag: committed.etag.clone() });
        }
        r
    }

    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        self.inner.read_changes(cursor, limit).await
    }

    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        self.inner.scan(after, limit).await
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    PreLock {
        secs: u64,
        target: bool,
    },
    Escalate {
        write: bool,
        secs: u64,
    },
    Renew {
        secs: u64,
    },
    /// 0 and 1: the right target; 2: the current location; 3: some other region.
    Swap {
        aim: u8,
    },
    Release,
}

#[derive(Debug, Clone, Copy)]
struct Act {
    who: usize,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Step {
    Do(Act),
    /// Two acts at once; the first to reach its write is held there while the other
    /// completes, so the first writes on a stale ETag.
    Race(Act, Act),
    Advance(u64),
    /// The clock steps back this many milliseconds: no more than the skew margin,
    /// which is the step the design absorbs (a larger step shortens the convergence
    /// wait by the excess; that is the lease's stated clock assumption, not a bug).
    Rewind(u64),
    Inject412(usize),
    Interfere {
        who: usize,
        n: u32,
    },
    Resolve(usize),
    /// The last-granted orchestrator waits out the convergence delay and carries its
    /// migration to the swap (each act checked on its own; any may be refused).
    Cutover,
}

fn act(n: usize) -> impl Strategy<Value = Act> {
    let kind = prop_oneof![
        3 => (1u64..=150, any::<bool>()).prop_map(|(secs, target)| Kind::PreLock { secs, target }),
        3 => (any::<bool>(), 1u64..=60).prop_map(|(write, secs)| Kind::Escalate { write, secs }),
        2 => (1u64..=200).prop_map(|secs| Kind::Renew { secs }),
        2 => (0u8..4).prop_map(|aim| Kind::Swap { aim }),
        1 => Just(Kind::Release),
    ];
    // Index n stands for whoever was granted a lock last, so that random cases often
    // carry one migration through to its swap.
    (0..=n, kind).prop_map(|(who, kind)| Act { who, kind })
}

fn step(n: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => act(n).prop_map(Step::Do),
        2 => (act(n), act(n)).prop_map(|(a, b)| Step::Race(a, b)),
        4 => (0u64..=40).prop_map(Step::Advance),
        1 => (1u64..=SKEW_MS).prop_map(Step::Rewind),
        1 => (1usize..=3).prop_map(Step::Inject412),
        1 => (0..n, 1u32..=3).prop_map(|(who, n)| Step::Interfere { who, n }),
        2 => (0..n).prop_map(Step::Resolve),
        1 => Just(Step::Cutover),
    ]
}

struct Orch {
    client: RoutingClient,
    observed: Arc<Observed>,
    /// The last token this orchestrator was granted (a random one it never held at
    /// first): stale tokens keep being presented after release, swap or expiry.
    token: LockToken,
}

struct World {
    clock: Arc<ManualClock>,
    store: stores::Instrumented,
    log: Log,
    orchs: Vec<Orch>,
    policy: LockPolicy,
    /// Which act each orchestrator commit belongs to, by the ETag it produced.
    attributed: HashMap<ETag, (usize, Kind, LockToken)>,
    /// Who was granted a lock last.
    last_granted: usize,
    /// Total of the backward clock steps so far: true elapsed time is the clock
    /// reading plus this.
    stepped_back: Duration,
    /// `stepped_back` as it stood when each change was committed.
    offset_at: Mutex<HashMap<ETag, Duration>>,
}

fn policy() -> LockPolicy {
    let policy = LockPolicy::declared(TTLS[1], LAG, MAX_PRE_LOCK);
    assert_eq!(policy.skew_margin, Duration::from_millis(SKEW_MS));
    policy
}

/// How long after a pre-lock an escalation is allowed: the delay and the skew margin.
fn convergence() -> Duration {
    policy().convergence_delay + policy().skew_margin
}

fn settled(v: &Versioned) -> Versioned {
    Versioned {
        doc: lifecycle::settle(v.doc.clone(), v.committed_at),
        etag: v.etag.clone(),
        committed_at: v.committed_at,
    }
}

impl World {
    async fn new(n: usize) -> Self {
        let clock = Arc::new(ManualClock::at_epoch());
        let store = stores::Instrumented::new(
            clock.clone(),
            MemoryStoreConfig { replica_lag: LAG, change_log_capacity: 100_000 },
        );
        store.memory.create(&LocationDocument::new(ID, REGIONS[0])).await.unwrap();
        // Well past the replica lag, so small backward clock steps cannot make the
        // document's creation itself invisible to replicas.
        clock.advance(Duration::from_secs(60));
        let log: Log = Arc::default();
        let orchs = (0..n)
            .map(|who| {
                let observed =
                    Arc::new(Observed { inner: store.store(), who, log: log.clone(), interfere: AtomicU32::new(0) });
                let client = RoutingClient::new(
                    observed.clone(),
                    clock.clone(),
                    TieredCache::try_new(&TTLS).unwrap(),
                    policy(),
                    ClientOptions { retry_budget: BUDGET, ..ClientOptions::default() },
                );
                Orch { client, observed, token: LockToken::generate() }
            })
            .collect();
        Self {
            clock,
            store,
            log,
            orchs,
            policy: policy(),
            attributed: HashMap::new(),
            last_granted: 0,
            stepped_back: Duration::ZERO,
            offset_at: Mutex::default(),
        }
    }

    /// The write-region document as every reader takes it (settled by its commit time).
    async fn current(&self) -> Versioned {
        settled(&self.store.memory.read(ID, ReadFrom::WriteRegion).await.unwrap())
    }

    fn log_len(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// Commits `who` made since log position `from`.
    fn commits_by(&self, who: usize, from: usize) -> Vec<ETag> {
        self.log.lock().unwrap()[from..]
            .iter()
            .filter_map(|e| match e {
                Event::Committed { who: w, etag, .. } if *w == who => Some(etag.clone()),
                _ => None,
            })
            .collect()
    }
}

fn escalation_phase(write: bool) -> Phase {
    if write {
        Phase::Write
    } else {
        Phase::HardDelete
    }
}

fn next_region(location: &str) -> &'static str {
    let i = REGIONS.iter().position(|r| *r == location).unwrap_or(0);
    REGIONS[(i + 1) % REGIONS.len()]
}

/// Where a swap by `token` aims, decided from the document the harness saw before the act.
fn swap_target(doc: &LocationDocument, token: &LockToken, aim: u8) -> String {
    let declared = doc
        .secondary
        .as_ref()
        .filter(|s| s.lock.as_ref().is_some_and(|l| l.token.matches(token)))
        .map(|s| s.location.clone());
    match aim {
        0 | 1 => declared.unwrap_or_else(|| next_region(&doc.primary.location).to_owned()),
        2 => doc.primary.location.clone(),
        _ => next_region(next_region(&doc.primary.location)).to_owned(),
    }
}

fn pre_lock_request(doc: &LocationDocument, secs: u64, target: bool) -> PreLockRequest {
    PreLockRequest {
        owner: "prop".into(),
        duration: Duration::from_secs(secs),
        target_location: target.then(|| next_region(&doc.primary.location).to_owned()),
    }
}

/// Runs one act through the orchestrator's client. Returns the written record and, for
/// a pre-lock, the granted token.
async fn perform(
    o: &Orch,
    kind: Kind,
    doc0: &LocationDocument,
) -> Result<(Arc<Versioned>, Option<LockToken>), RoutingError> {
    let c = &o.client;
    let t = &o.token;
    match kind {
        Kind::PreLock { secs, target } => {
            c.pre_lock(ID, &pre_lock_request(doc0, secs, target)).await.map(|g| (g.record, Some(g.token)))
        }
        Kind::Escalate { write, secs } => {
            c.escalate(ID, t, escalation_phase(write), Duration::from_secs(secs)).await.map(|v| (v, None))
        }
        Kind::Renew { secs } => c.renew(ID, t, Duration::from_secs(secs)).await.map(|v| (v, None)),
        Kind::Swap { aim } => c.swap(ID, t, &swap_target(doc0, t, aim)).await.map(|v| (v, None)),
        Kind::Release => c.release(ID, t).await.map(|v| (v, None)),
    }
}

/// What the pure lifecycle says the act should do to the settled `doc` at `now`, as
/// readers take it once committed at `now` (the memory store commits on the same clock).
fn oracle(
    w: &World,
    o: &Orch,
    kind: Kind,
    doc: &LocationDocument,
    now: DateTime<Utc>,
) -> Result<LocationDocument, LockError> {
    let t = &o.token;
    let p = &w.policy;
    let next = match kind {
        Kind::PreLock { secs, target } => {
            lifecycle::pre_lock(doc, &pre_lock_request(doc, secs, target), LockToken::generate(), p, now)
        }
        Kind::Escalate { write, secs } => {
            lifecycle::escalate(doc, t, escalation_phase(write), Duration::from_secs(secs), p, now)
        }
        Kind::Renew { secs } => lifecycle::renew(doc, t, Duration::from_secs(secs), p, now),
        Kind::Swap { aim } => lifecycle::swap(doc, t, &swap_target(doc, t, aim), p, now),
        Kind::Release => lifecycle::release(doc, t, now),
    };
    next.map(|next| lifecycle::settle(next, now))
}

/// The document's JSON with tokens masked, the call records (random keys) and the third
/// party's field dropped, for comparing what was written with what the lifecycle
/// prescribes.
fn normalized(doc: &LocationDocument) -> Value {
    let mut v = doc.to_json();
    v.as_object_mut().unwrap().remove(TOUCH);
    v.as_object_mut().unwrap().remove("operations");
    for section in ["primary", "secondary"] {
        if let Some(lock) = v.get_mut(section).and_then(|s| s.get_mut("lock")).filter(|l| l.is_object()) {
            lock["token"] = Value::from("masked");
        }
    }
    v
}

fn touch(doc: &LocationDocument) -> u64 {
    doc.extra.get(TOUCH).and_then(Value::as_u64).unwrap_or(0)
}

fn is_holder(doc: &LocationDocument, token: &LockToken, now: DateTime<Utc>) -> bool {
    doc.primary.lock.as_ref().is_some_and(|l| l.token.matches(token) && l.is_live(now))
}

fn held_expired(doc: &LocationDocument, token: &LockToken, now: DateTime<Utc>) -> bool {
    doc.primary.lock.as_ref().is_some_and(|l| l.token.matches(token) && !l.is_live(now))
}

/// Checks of one act's outcome that need to know what was presented: a non-holder or
/// an expired token commits nothing; a success commits exactly once.
fn check_act_outcome(
    w: &mut World,
    act: Act,
    presented: &LockToken,
    doc0: &LocationDocument,
    now: DateTime<Utc>,
    log_from: usize,
    result: &Result<(Arc<Versioned>, Option<LockToken>), RoutingError>,
) -> Result<(), TestCaseError> {
    let commits = w.commits_by(act.who, log_from);
    let is_pre_lock = matches!(act.kind, Kind::PreLock { .. });
    match result {
        Ok((v, granted)) => {
            prop_assert_eq!(commits.as_slice(), std::slice::from_ref(&v.etag), "a successful act commits exactly once");
            prop_assert!(
                is_pre_lock || is_holder(doc0, presented, now),
                "a mutation by a non-holder committed: {:?}",
                act
            );
            let token = granted.clone().unwrap_or_else(|| presented.clone());
            w.attributed.insert(v.etag.clone(), (act.who, act.kind, token));
        }
        Err(e) => {
            prop_assert!(commits.is_empty(), "a refused act committed: {:?} -> {:?}", act, e);
            if !is_pre_lock && held_expired(doc0, presented, now) {
                // A malformed request is refused as such before the lock is looked at.
                prop_assert!(
                    matches!(
                        e,
                        RoutingError::Lock(
                            LockError::LeaseExpired { .. } | LockError::TokenMismatch | LockError::InvalidRequest(_)
                        )
                    ),
                    "an expired token got {:?} instead of a refusal",
                    e
                );
            }
        }
    }
    Ok(())
}

fn check_lock_bounds(lock: &LockInfo, what: &str) -> Result<(), TestCaseError> {
    prop_assert!(lock.expires_at <= lock.pre_lock_expires_at, "{}: expiresAt past preLockExpiresAt", what);
    prop_assert!(lock.expires_at <= lock.max_expires_at, "{}: expiresAt past maxExpiresAt", what);
    prop_assert!(lock.pre_lock_expires_at <= lock.max_expires_at, "{}: preLockExpiresAt past maxExpiresAt", what);
    Ok(())
}

fn check_bounds(doc: &LocationDocument) -> Result<(), TestCaseError> {
    if let Some(l) = &doc.primary.lock {
        check_lock_bounds(l, "primary")?;
        // The target declared at pre-lock stays locked as long as the migration's lock.
        if let Some(target) = doc.secondary.as_ref().and_then(|s| s.lock.as_ref()).filter(|t| t.token.matches(&l.token))
        {
            prop_assert!(target.expires_at >= l.expires_at, "the declared target's lock lapses before the migration's");
        }
    }
    if let Some(l) = doc.secondary.as_ref().and_then(|s| s.lock.as_ref()) {
        check_lock_bounds(l, "secondary")?;
    }
    Ok(())
}

/// The guard a swap leaves on the old location: a write-phase lock on `secondary`
/// under a token that is not the primary lock's (a declared target's lock stays in
/// preLock).
fn swap_guard(doc: &LocationDocument) -> Option<&lockprobe::document::Section> {
    let primary = doc.primary.lock.as_ref();
    doc.secondary.as_ref().filter(|s| {
        s.lock.as_ref().is_some_and(|g| g.phase == Phase::Write && !primary.is_some_and(|p| p.token.matches(&g.token)))
    })
}

/// One committed change judged against its predecessor, at its commit time `t`.
fn check_transition(
    w: &World,
    prev: &LocationDocument,
    next: &LocationDocument,
    t: DateTime<Utc>,
    who: usize,
    etag: &ETag,
    guard_slack: Duration,
) -> Result<(), TestCaseError> {
    let (pl, nl) = (prev.primary.lock.as_ref(), next.primary.lock.as_ref());
    prop_assert!(touch(next) >= touch(prev), "an unknown field was dropped on rewrite");

    if who == INTERFERER {
        prop_assert_eq!(normalized(prev), normalized(next), "the third party's write changed routing state");
        prop_assert_eq!(pl.map(|l| l.token.clone()), nl.map(|l| l.token.clone()));
        return Ok(());
    }

    // At most one live token: a new token only when no live lock exists.
    let new_token = match (pl, nl) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(p), Some(n)) => !p.token.matches(&n.token),
    };
    if new_token {
        prop_assert!(prev.live_lock(t).is_none(), "a new token was issued while a live lock existed");
    }

    // An expired token can do nothing: its lock is either untouched or replaced by a
    // new token's.
    if let Some(p) = pl.filter(|p| !p.is_live(t)) {
        let untouched = nl == Some(p);
        prop_assert!(untouched || new_token, "the lock changed under an expired token");
    }

    // Same token: the parent lease and the ceiling only move as the lifecycle allows.
    if let (Some(p), Some(n)) = (pl, nl) {
        if !new_token {
            prop_assert_eq!(p.max_expires_at, n.max_expires_at, "maxExpiresAt moved");
            prop_assert!(n.phase >= p.phase, "a phase went backwards");
            if p.phase != Phase::PreLock {
                prop_assert_eq!(
                    p.pre_lock_expires_at,
                    n.pre_lock_expires_at,
                    "the parent lease moved after escalation"
                );
            }
        }
    }

    // Location and lock change together, or not at all.
    if next.primary.location != prev.primary.location {
        let p = pl.filter(|p| p.is_live(t) && p.phase == Phase::Write);
        prop_assert!(p.is_some(), "the location changed without a live write lock");
        let p = p.unwrap();
        prop_assert!(nl.is_none(), "the location changed but the lock stayed");
        prop_assert!(!next.migrating, "the location changed but migrating stayed set");
        let guard = next.secondary.as_ref();
        prop_assert!(
            guard.is_some_and(|s| s.location == prev.primary.location
                && s.lock.as_ref().is_some_and(|l| l.token.matches(&p.token) && l.is_live(t))),
            "a swap did not guard the old location"
        );
    } else if pl.is_some() && nl.is_none() {
        // Cleared in place: a release, never the lock half of a swap.
        let p = pl.unwrap();
        let guards_old_location = next.secondary.as_ref().is_some_and(|s| {
            s.location == prev.primary.location && s.lock.as_ref().is_some_and(|l| l.token.matches(&p.token))
        });
        prop_assert!(!guards_old_location, "the lock was cleared as by a swap but the location did not move");
        prop_assert!(!next.migrating, "released but still migrating");
    }

    // A swap's guard on the old location is neither dropped nor shortened while live.
    // Live in true elapsed time: a backward clock step since the guard was written
    // (`guard_slack`) delays the clock, not the convergence it waits for.
    let guard = swap_guard(prev).filter(|s| s.lock.as_ref().is_some_and(|g| g.is_live(t + to_chrono(guard_slack))));
    if let Some(guarded) = guard {
        let until = guarded.lock.as_ref().unwrap().expires_at;
        prop_assert!(
            next.secondary.as_ref().is_some_and(
                |s| s.location == guarded.location && s.lock.as_ref().is_some_and(|l| l.expires_at >= until)
            ),
            "a live swap guard on {} was dropped or shortened",
            guarded.location
        );
    }

    // Lock operations: the current token and (checked by the caller) the current ETag.
    let attributed = w.attributed.get(etag);
    prop_assert!(attributed.is_some() || who == INTERFERER, "a commit no successful act accounts for");
    if let Some((_, kind, token)) = attributed {
        if matches!(kind, Kind::PreLock { .. }) {
            prop_assert!(prev.live_lock(t).is_none(), "pre-lock committed over a live lock");
            prop_assert!(nl.is_some_and(|n| n.token.matches(token)), "pre-lock wrote a token it did not grant");
        } else {
            prop_assert!(is_holder(prev, token, t), "{:?} committed without the live token", kind);
        }
    }
    Ok(())
}

/// The invariants over the whole history and the write-region document.
async fn check_world(w: &World) -> Result<(), TestCaseError> {
    let batch = w.store.memory.read_changes(&ChangeCursor::beginning(), usize::MAX).await.unwrap();
    let changes = batch.changes;
    let current = w.current().await;
    let last = changes.last().unwrap();
    prop_assert_eq!(&settled(&last.doc), &current, "the write region is not the last committed change");

    let log = w.log.lock().unwrap().clone();
    let commit_at: HashMap<&ETag, (usize, &ETag, usize)> = log
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Event::Committed { who, if_match, etag } => Some((etag, (*who, if_match, i))),
            Event::Read { .. } => None,
        })
        .collect();

    let mut offsets = w.offset_at.lock().unwrap();
    for c in &changes {
        offsets.entry(c.doc.etag.clone()).or_insert(w.stepped_back);
    }
    check_bounds(&settled(&changes[0].doc).doc)?;
    let mut guard_written_at = Duration::ZERO;
    for pair in changes.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        let offset = offsets[&next.doc.etag];
        check_bounds(&settled(&next.doc).doc)?;
        let Some(&(who, if_match, at)) = commit_at.get(&next.doc.etag) else {
            return Err(TestCaseError::fail("a change committed outside every client"));
        };
        prop_assert_eq!(if_match, &prev.doc.etag, "a commit presented an ETag other than its predecessor's");
        let last_read = log[..at].iter().rev().find_map(|e| match e {
            Event::Read { who: r, etag } if *r == who => Some(etag),
            _ => None,
        });
        prop_assert_eq!(last_read, Some(if_match), "a writer presented an ETag it had not just read");
        let (prev_doc, next_doc) = (settled(&prev.doc).doc, settled(&next.doc).doc);
        check_transition(
            w,
            &prev_doc,
            &next_doc,
            next.doc.committed_at,
            who,
            &next.doc.etag,
            offset - guard_written_at,
        )?;
        let lock_of = |d: &LocationDocument| swap_guard(d).and_then(|s| s.lock.clone());
        if lock_of(&next.doc.doc).is_some() && lock_of(&next.doc.doc) != lock_of(&prev.doc.doc) {
            guard_written_at = offset;
        }
    }
    drop(offsets);

    // Every orchestrator commit is one successful act's single write.
    let orchestrator_commits = commit_at.values().filter(|(who, _, _)| *who != INTERFERER).count();
    prop_assert_eq!(orchestrator_commits, w.attributed.len(), "commits and successful acts do not match one to one");

    // At most one orchestrator's token is accepted right now.
    let now = w.clock.now();
    let holders = w.orchs.iter().filter(|o| lifecycle::held_lock(&current.doc, &o.token, now).is_ok()).count();
    prop_assert!(holders <= 1, "{} orchestrators hold a live token", holders);
    Ok(())
}

impl World {
    /// Resolves the "last granted" stand-in to a real orchestrator.
    fn who(&self, act: Act) -> Act {
        Act { who: if act.who >= self.orchs.len() { self.last_granted } else { act.who }, ..act }
    }

    fn granted(&mut self, who: usize, token: LockToken) {
        self.orchs[who].token = token;
        self.last_granted = who;
    }
}

async fn do_act(w: &mut World, act: Act) -> Result<(), TestCaseError> {
    let act = w.who(act);
    let doc0 = w.current().await;
    let now = w.clock.now();
    let o = &w.orchs[act.who];
    let presented = o.token.clone();
    let expected = oracle(w, o, act.kind, &doc0.doc, now);
    let from = w.log_len();
    let replaces0 = w.store.counts().replace;
    let result = perform(o, act.kind, &doc0.doc).await;
    let replaces = w.store.counts().replace - replaces0;

    match (&expected, &result) {
        (Err(e), r) => prop_assert_eq!(
            r.as_ref().err(),
            Some(&RoutingError::Lock(e.clone())),
            "refusal differs from the lifecycle"
        ),
        (Ok(doc), Ok((v, _))) => {
            prop_assert_eq!(normalized(doc), normalized(&v.doc), "written document differs from the lifecycle")
        }
        (Ok(_), Err(RoutingError::RetryExhausted { attempts })) => {
            prop_assert_eq!(*attempts, BUDGET);
            prop_assert!(replaces >= u64::from(BUDGET), "gave up after {} replaces", replaces);
        }
        (Ok(_), Err(e)) => {
            return Err(TestCaseError::fail(format!("the lifecycle allows {act:?}, the client said {e:?}")))
        }
    }
    check_act_outcome(w, act, &presented, &doc0.doc, now, from, &result)?;
    if let Ok((_, Some(granted))) = result {
        w.granted(act.who, granted);
    }
    Ok(())
}

async fn race(w: &mut World, a: Act, b: Act) -> Result<(), TestCaseError> {
    let (a, b) = (w.who(a), w.who(b));
    if a.who == b.who {
        do_act(w, a).await?;
        check_world(w).await?;
        return do_act(w, b).await;
    }
    let doc0 = w.current().await;
    let now = w.clock.now();
    let from = w.log_len();
    // Whoever writes first is held at its replace while the other reads, decides and writes.
    w.store.inject(OpKind::Replace, FaultAction::Delay(Duration::from_millis(1)), 1);
    let (oa, ob) = (&w.orchs[a.who], &w.orchs[b.who]);
    let (ta, tb) = (oa.token.clone(), ob.token.clone());
    let (ra, rb) = futures::join!(perform(oa, a.kind, &doc0.doc), perform(ob, b.kind, &doc0.doc));
    // A delay nobody used must not leak into later steps.
    w.store.clear_faults();
    check_act_outcome(w, a, &ta, &doc0.doc, now, from, &ra)?;
    check_act_outcome(w, b, &tb, &doc0.doc, now, from, &rb)?;
    for (act, r) in [(a, ra), (b, rb)] {
        if let Ok((_, Some(granted))) = r {
            w.granted(act.who, granted);
        }
    }
    Ok(())
}

async fn resolve(w: &World, who: usize) -> Result<(), TestCaseError> {
    let current = w.current().await;
    let now = w.clock.now();
    let before = w.store.counts();
    let r = w.orchs[who].client.resolve(ID).await;
    let reads = w.store.counts().since(&before);
    let r = match r {
        Ok(r) => r,
        Err(e) => return Err(TestCaseError::fail(format!("resolve of an existing document failed: {e:?}"))),
    };
    match r.source {
        Source::Cache => prop_assert_eq!(reads.reads(), 0),
        Source::ReadThrough => prop_assert_eq!(reads.read_write_region, 1),
        Source::Store => prop_assert!(reads.read_replica == 1 && reads.read_write_region == 0),
    }
    // Enforcement never acts on a stale view of a started lock. (A cache hit is fine
    // when it holds the current version: after a backward clock step, a lease that had
    // lapsed when the entry was fetched is live again by the clock.)
    if current.doc.primary.lock.as_ref().is_some_and(|l| l.is_live(now) && l.effective_at <= now) {
        prop_assert_eq!(&r.record.etag, &current.etag, "resolve served a stale document while a lock is in force");
    }
    Ok(())
}

async fn run(n: usize, steps: Vec<Step>) -> Result<World, TestCaseError> {
    let mut w = World::new(n).await;
    check_world(&w).await?;
    for step in steps {
        match step {
            Step::Do(a) => do_act(&mut w, a).await?,
            Step::Race(a, b) => race(&mut w, a, b).await?,
            Step::Advance(s) => w.clock.advance(Duration::from_secs(s)),
            Step::Rewind(ms) => {
                w.clock.set(w.clock.now() - to_chrono(Duration::from_millis(ms)));
                w.stepped_back += Duration::from_millis(ms);
            }
            Step::Inject412(k) => w.store.inject(OpKind::Replace, FaultAction::LostRace, k as u32),
            Step::Interfere { who, n } => {
                w.orchs[who].observed.interfere.fetch_add(n, Ordering::SeqCst);
            }
            Step::Resolve(who) => resolve(&w, who).await?,
            Step::Cutover => {
                let holder = w.orchs.len();
                w.clock.advance(convergence());
                for kind in [
                    Kind::Escalate { write: false, secs: 20 },
                    Kind::Escalate { write: true, secs: 20 },
                    Kind::Swap { aim: 0 },
                ] {
                    do_act(&mut w, Act { who: holder, kind }).await?;
                    check_world(&w).await?;
                }
            }
        }
        check_world(&w).await?;
    }
    Ok(w)
}

fn runtime() -> tokio::runtime::Runtime {
    // Real tokio time (the manifest does not enable tokio's test-util): a staged race
    // costs one millisecond.
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn orchestrators_interleaved_keep_every_invariant(
        (n, steps) in (2usize..=4).prop_flat_map(|n| (Just(n), proptest::collection::vec(step(n), 1..60)))
    ) {
        runtime().block_on(run(n, steps))?;
    }
}

/// A hand-written interleaving that must exercise the whole lifecycle, so the property
/// test above cannot pass merely because random cases never reach a swap.
#[test]
fn a_full_migration_passes_the_same_checks() {
    let steps = vec![
        Step::Do(Act { who: 0, kind: Kind::PreLock { secs: 100, target: true } }),
        Step::Do(Act { who: 1, kind: Kind::PreLock { secs: 100, target: false } }),
        Step::Inject412(2),
        Step::Advance(11),
        Step::Resolve(1),
        Step::Do(Act { who: 0, kind: Kind::Escalate { write: false, secs: 30 } }),
        Step::Interfere { who: 0, n: 1 },
        Step::Do(Act { who: 0, kind: Kind::Escalate { write: true, secs: 30 } }),
        Step::Resolve(1),
        Step::Race(Act { who: 0, kind: Kind::Renew { secs: 20 } }, Act { who: 1, kind: Kind::Release }),
        Step::Do(Act { who: 0, kind: Kind::Swap { aim: 0 } }),
        Step::Resolve(1),
        Step::Advance(200),
        Step::Do(Act { who: 0, kind: Kind::Release }),
    ];
    runtime().block_on(async {
        let w = run(2, steps).await.unwrap();
        // The script really went through: pre-lock, two escalations, a renewal, a swap.
        let history = w.store.memory.read_changes(&ChangeCursor::beginning(), usize::MAX).await.unwrap().changes;
        let phases: Vec<_> = history.iter().filter_map(|c| c.doc.doc.primary.lock.as_ref().map(|l| l.phase)).collect();
        assert!(phases.contains(&Phase::Write), "never reached the write phase: {phases:?}");
        assert_eq!(w.current().await.doc.primary.location, REGIONS[1]);
        assert_eq!(w.attributed.len(), 5, "pre-lock, hardDelete, write, renew, swap");
    });
}

/// Forges a commit as if orchestrator 0 had read the current version and written
/// `doc` over it, bypassing the library, and returns what the checks say.
async fn forged(w: &World, doc: &LocationDocument) -> Result<(), TestCaseError> {
    let current = w.current().await;
    let etag = w.store.memory.put_raw(ID, doc.to_json());
    {
        let mut log = w.log.lock().unwrap();
        log.push(Event::Read { who: 0, etag: current.etag.clone() });
        log.push(Event::Committed { who: 0, if_match: current.etag, etag });
    }
    check_world(w).await
}

async fn write_locked_world() -> World {
    let mut w = World::new(2).await;
    do_act(&mut w, Act { who: 0, kind: Kind::PreLock { secs: 100, target: false } }).await.unwrap();
    w.clock.advance(convergence());
    do_act(&mut w, Act { who: 0, kind: Kind::Escalate { write: false, secs: 30 } }).await.unwrap();
    do_act(&mut w, Act { who: 0, kind: Kind::Escalate { write: true, secs: 30 } }).await.unwrap();
    check_world(&w).await.unwrap();
    w
}

fn failure(r: Result<(), TestCaseError>) -> String {
    match r {
        Ok(()) => panic!("the checks let a forged history through"),
        Err(e) => e.to_string(),
    }
}

/// The checks themselves can fail: a location switched without clearing the lock is caught.
#[test]
fn the_checks_catch_a_half_swap() {
    runtime().block_on(async {
        let w = write_locked_world().await;
        let mut doc = w.current().await.doc;
        doc.primary.location = REGIONS[1].into();
        assert!(failure(forged(&w, &doc).await).contains("the lock stayed"));
    });
}

/// The checks catch a lease stretched past its ceiling.
#[test]
fn the_checks_catch_an_expiry_past_the_ceiling() {
    runtime().block_on(async {
        let w = write_locked_world().await;
        let mut doc = w.current().await.doc;
        let lock = doc.primary.lock.as_mut().unwrap();
        lock.expires_at = lock.max_expires_at + chrono::TimeDelta::seconds(1);
        assert!(failure(forged(&w, &doc).await).contains("past"));
    });
}

/// The checks catch a lock change made after the lease lapsed.
#[test]
fn the_checks_catch_an_expired_token_acting() {
    runtime().block_on(async {
        let w = write_locked_world().await;
        w.clock.advance(Duration::from_secs(3600));
        let mut doc = w.current().await.doc;
        doc.primary.lock = None;
        doc.migrating = false;
        assert!(failure(forged(&w, &doc).await).contains("expired token"));
    });
}

/// The checks catch a write that no client made.
#[test]
fn the_checks_catch_a_blind_write() {
    runtime().block_on(async {
        let w = write_locked_world().await;
        let doc = w.current().await.doc;
        w.store.memory.put_raw(ID, doc.to_json());
        assert!(failure(check_world(&w).await).contains("outside every client"));
    });
}

/// The checks catch a swap guard removed while it is live.
#[test]
fn the_checks_catch_a_dropped_swap_guard() {
    runtime().block_on(async {
        let mut w = write_locked_world().await;
        do_act(&mut w, Act { who: 0, kind: Kind::Swap { aim: 0 } }).await.unwrap();
        check_world(&w).await.unwrap();
        let mut doc = w.current().await.doc;
        assert!(swap_guard(&doc).is_some(), "the swap left a guard");
        doc.secondary = None;
        assert!(failure(forged(&w, &doc).await).contains("swap guard"));
    });
}
