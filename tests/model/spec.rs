//! The lock protocol as a stateright model, over the real routing code.
//!
//! Actors: orchestrators (pre-lock, escalate, renew, swap with its copy, release, and a
//! retry with the same idempotency key after an ambiguous answer), an operator who
//! force-releases a lock at any moment (requested by one principal, approved by another,
//! the approval's write conditional on the ETag it was decided on), the store (one
//! document, ETag compare-and-set, commits that land late, acknowledgements that arrive
//! late or never), service instances (each a cache and a clock that may be skewed by
//! one tick; a replica within the replication bound) and users who write, delete and
//! read one item. Time is discrete: tick `n` is `BASE + n` seconds on the true clock.
//!
//! What runs the shipped code: every lock decision is [`lifecycle::decide`], every
//! committed version is read through [`lifecycle::settle`], a client's own outcome is
//! [`lifecycle::took_effect`]; a user operation is resolved by the real
//! [`RoutingClient::resolve`] (cache, replica, read-through; the freshness rules of
//! `routing::freshness`) over a store that serves this model's versions, and decided by
//! [`enforce`]. What is mirrored, because it is an async loop whose steps must
//! interleave with everything else: the lock-call loop of `RoutingClient::call`
//! (read settled, decide, write If-Match, judge; unknown outcomes resolved by re-reading),
//! `prepare_swap`'s wait, the swap handler's copy, and the item store of the reference
//! service. Each mirrored piece names its source.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};

use lockprobe::clock::ManualClock;
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::force_release::{self, AdminCall, ForceReleaseRequest};
use lockprobe::routing::freshness;
use lockprobe::routing::lifecycle::{
    self, Decided, Deviations, LockCall, LockError, LockPolicy, PreLockRequest, DEFAULT_KEYED_RECORDS,
};
use lockprobe::routing::{
    enforce, ClientOptions, Decision, LocationDocument, LockToken, Operation, Phase, RoutingClient, Source,
};
use lockprobe::store::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Versioned,
};
use stateright::{Model, Property};

/// The one resource.
pub const ID: &str = "res";
/// Its two locations.
pub const LOCATIONS: [&str; 2] = ["a", "b"];

/// The timing of the modelled deployment, in ticks (one tick = one second).
pub mod timing {
    /// Cache TTL (one tier).
    pub const TTL: u64 = 1;
    /// Replication bound: a replica shows a version that was current at most this long ago.
    pub const REPLICATION: u64 = 1;
    /// The skew margin: the largest difference between any two clocks (one tick).
    pub const SKEW_MARGIN: u64 = 1;
    /// Requested pre-lock lease (from effectiveAt).
    pub const PRE_LOCK: u64 = 3;
    /// The service's maximum pre-lock (renewal ceiling).
    pub const MAX_PRE_LOCK: u64 = 4;
    /// Lease asked for by each escalation.
    pub const ESCALATE: u64 = 1;
    /// Extension asked for by a renewal.
    pub const RENEW: u64 = 3;
    /// The client's decision age: user operations are atomic in the model, so zero.
    pub const DECISION_AGE: u64 = 0;
}

/// Which design is checked: the shipped protocol or one broken variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The protocol as shipped: every deviation off.
    Fixed,
    /// effectiveAt counted from the decide time (`Deviations::legacy_effective_at`).
    LegacyEffectiveAt,
    /// A renewal takes effect whenever it lands (`Deviations::legacy_renewal`).
    LegacyRenewal,
    /// The swap's write ignores the ETag (the modelled client's write step).
    SwapWithoutIfMatch,
    /// Escalation granted before effectiveAt (`Deviations::early_escalation`).
    EarlyEscalation,
    /// Caches serve a started lock (`Deviations::cache_serves_started_locks`).
    CacheServesStartedLocks,
    /// Contract 1.1's record keeping: a full document drops its oldest keyed record for a
    /// new one, even inside its window (`Deviations::legacy_record_eviction`).
    LegacyRecordEviction,
    /// A rollout's expand step: every write in format 1, settled at its decision
    /// (`LockPolicy::write_format`), as readers of format 1 only need. Not a bug but a
    /// documented trade: what a late commit can do to it is what the model must show.
    Format1Writes,
    /// The force-release approval's write ignores the ETag: it lands on whatever the
    /// document became since the approval was decided (checked at
    /// [`Bounds::force_release`]).
    ForceReleaseWithoutIfMatch,
}

impl Variant {
    /// Every variant, the fixed protocol first.
    pub const ALL: [Variant; 9] = [
        Variant::Fixed,
        Variant::LegacyEffectiveAt,
        Variant::LegacyRenewal,
        Variant::SwapWithoutIfMatch,
        Variant::EarlyEscalation,
        Variant::CacheServesStartedLocks,
        Variant::LegacyRecordEviction,
        Variant::Format1Writes,
        Variant::ForceReleaseWithoutIfMatch,
    ];

    /// The name used on the command line and in the docs.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Fixed => "fixed",
            Variant::LegacyEffectiveAt => "legacy-effective-at",
            Variant::LegacyRenewal => "legacy-renewal",
            Variant::SwapWithoutIfMatch => "swap-without-if-match",
            Variant::EarlyEscalation => "early-escalation",
            Variant::CacheServesStartedLocks => "cache-serves-started-locks",
            Variant::LegacyRecordEviction => "legacy-record-eviction",
            Variant::Format1Writes => "format-1-writes",
            Variant::ForceReleaseWithoutIfMatch => "force-release-without-if-match",
        }
    }

    /// The newest document format the variant's writers write.
    fn write_format(self) -> u64 {
        match self {
            Variant::Format1Writes => lockprobe::document::FORMAT_1,
            _ => lockprobe::document::NEWEST_FORMAT,
        }
    }

    fn deviations(self) -> Deviations {
        let mut d = Deviations::default();
        match self {
            Variant::Fixed
            | Variant::SwapWithoutIfMatch
            | Variant::Format1Writes
            | Variant::ForceReleaseWithoutIfMatch => {}
            Variant::LegacyEffectiveAt => d.legacy_effective_at = true,
            Variant::LegacyRenewal => d.legacy_renewal = true,
            Variant::EarlyEscalation => d.early_escalation = true,
            Variant::CacheServesStartedLocks => d.cache_serves_started_locks = true,
            Variant::LegacyRecordEviction => d.legacy_record_eviction = true,
        }
        d
    }
}

/// How much of the system is explored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Orchestrators (2 or 3); orchestrator `o` calls through instance `o % instances`.
    pub orchestrators: u8,
    /// Service instances (2): instance 0 runs on the true clock, the others on
    /// `skews` (every combination is an initial state).
    pub instances: u8,
    /// Offsets (ticks) an instance other than 0 may run at; every pair of clocks then
    /// differs by at most the skew margin when this is within {-1, 0, 1} for one instance.
    pub skews: Vec<i8>,
    /// The last tick.
    pub horizon: u8,
    /// Store messages (a write or its acknowledgement) that may cross a tick.
    pub delayed: u8,
    /// Lost acknowledgements plus client timeouts.
    pub ambiguous: u8,
    /// Migrations each orchestrator may start (a new one after the last ended).
    pub attempts: u8,
    /// Renewals per migration.
    pub renewals: u8,
    /// Whether an orchestrator may release (abort) its migration.
    pub release: bool,
    /// User requests in total (reads, writes and deletes, refused ones included).
    pub requests: u8,
    /// User writes in total (each writes a new value).
    pub writes: u8,
    /// User deletes in total.
    pub deletes: u8,
    /// Records of keyed calls a document keeps (`LockPolicy::keyed_records`). The suite
    /// keeps the default, which its bounds never reach (a migration makes at most five
    /// keyed calls, and no record leaves its window within the horizon);
    /// [`Bounds::record_cap`] keeps two, reached within its bounds, so the refusal of a
    /// third (and, in the legacy variant, the eviction of the oldest) is explored there.
    pub keyed_records: usize,
    /// Whether an operator may force-release the lock (one request, one approval).
    pub force_release: bool,
}

impl Bounds {
    /// The bounds checked in the test suite: 2 orchestrators, 2 instances, one delayed
    /// message, one ambiguous answer, one tick of skew either way.
    pub fn suite() -> Self {
        Self {
            orchestrators: 2,
            instances: 2,
            skews: vec![1],
            horizon: 4,
            delayed: 1,
            ambiguous: 1,
            attempts: 1,
            renewals: 1,
            release: false,
            requests: 2,
            writes: 1,
            deletes: 1,
            keyed_records: DEFAULT_KEYED_RECORDS,
            force_release: false,
        }
    }

    /// The suite's bounds with an operator who may force-release the lock at any moment:
    /// request it once a lock is live, approve it at any later step, the approval's
    /// write landing at any later step (or refused, and decided again, when the document
    /// changed). The orchestrators go on as if nothing happened until they are told.
    /// Smaller than the suite's in what the operator's steps multiply: no renewal, one
    /// user request (a write), and no message crossing a tick (a write still lands at
    /// any later step within its tick, before or after the operator's);
    /// `Bounds::wider("force-release")` keeps the delayed message and two requests
    /// (`scripts/model-bounds.sh`).
    pub fn force_release() -> Self {
        Self { force_release: true, renewals: 0, requests: 1, deletes: 0, delayed: 0, ..Self::suite() }
    }

    /// The bounds of the record cap: a document keeps two keyed records, and the horizon
    /// (7 ticks) is long enough for a pre-lock to lapse unacknowledged and another
    /// migration to take the resource and release it (`release`), so a repeat of the
    /// first pre-lock comes after the cap was reached (the fixed protocol refuses the
    /// third record, the release's; with a cap of three the legacy eviction has no
    /// counterexample within these bounds). No user requests and no renewals: what is
    /// checked here is the lock calls' idempotency, and each request multiplies the space
    /// by about ten.
    pub fn record_cap() -> Self {
        Self {
            horizon: 7,
            renewals: 0,
            release: true,
            requests: 0,
            writes: 0,
            deletes: 0,
            keyed_records: 2,
            ..Self::suite()
        }
    }

    /// The suite's bounds with instance 1 one tick behind the true clock instead of ahead
    /// (the suite checks both, each on its own; [`Bounds::wider`]`("behind")` both at once).
    pub fn behind() -> Self {
        Self { skews: vec![-1], ..Self::suite() }
    }

    /// The names of [`Bounds::wider`].
    pub const WIDER: [&'static str; 5] = ["release", "behind", "attempts", "force-release", "all"];

    /// The suite's bounds with what they leave out for their size (docs/model.md,
    /// *Wider bounds*): `release`, an orchestrator may release (abort) its migration;
    /// `behind`, instance 1 runs one tick behind, on time or one tick ahead (each an
    /// initial state); `attempts`, each orchestrator starts a second migration once its
    /// first ended; `force-release`, [`Bounds::force_release`] with the suite's delayed
    /// message; `all`, the first three at once. With what each must reach (the
    /// `sometimes` properties that show it is not vacuous).
    pub fn wider(name: &str) -> Option<(Self, Vec<&'static str>)> {
        let mut bounds = Self::suite();
        let mut wanted = vec!["a swap completes", "a retry settles an ambiguous pre-lock"];
        let release = |b: &mut Self, w: &mut Vec<&'static str>| {
            b.release = true;
            w.push("a release takes effect");
        };
        let behind = |b: &mut Self, w: &mut Vec<&'static str>| {
            b.skews = vec![-1, 0, 1];
            w.push("a swap completes with a clock behind");
        };
        let attempts = |b: &mut Self, w: &mut Vec<&'static str>| {
            b.attempts = 2;
            w.push("a second migration takes a lock");
        };
        match name {
            "release" => release(&mut bounds, &mut wanted),
            "behind" => behind(&mut bounds, &mut wanted),
            "attempts" => attempts(&mut bounds, &mut wanted),
            "force-release" => {
                bounds = Self { delayed: 1, requests: 2, ..Self::force_release() };
                wanted.push("a force-release removes a lock its holder still uses");
            }
            "all" => {
                release(&mut bounds, &mut wanted);
                behind(&mut bounds, &mut wanted);
                attempts(&mut bounds, &mut wanted);
            }
            _ => return None,
        }
        Some((bounds, wanted))
    }

    /// Refuses bounds the model cannot judge: more idempotency keys than it tracks, or
    /// a horizon at which a keyed call's record may leave its window (after which "at
    /// most once" no longer means "once inside its window").
    pub fn validate(&self, variant: Variant) -> Result<(), String> {
        let keys = self.orchestrators as u32 * self.attempts as u32 * (5 + self.renewals as u32);
        if keys > 64 {
            return Err(format!(
                "the model tracks at most 64 idempotency keys (orchestrators x attempts x (5 + renewals)): these bounds make {keys}"
            ));
        }
        // A record is kept until the ceiling of its lock (effectiveAt, at least the
        // decision + delay + margin, + the maximum pre-lock) + delay + margin by the
        // deciding clock, and dropped by a later decision whose clock is past that: clocks
        // apart by `span`, no sooner than this tick.
        let delay = timing::TTL + timing::REPLICATION;
        let start = if variant.deviations().legacy_effective_at { delay } else { delay + timing::SKEW_MARGIN };
        let window = (start + timing::MAX_PRE_LOCK + delay + timing::SKEW_MARGIN) as i16;
        let offsets = self.skews.iter().copied().chain([0]);
        let span = (offsets.clone().max().unwrap_or(0) - offsets.min().unwrap_or(0)) as i16;
        let last = window - span;
        if self.horizon as i16 > last {
            return Err(format!(
                "--horizon {}: a record of a keyed call may leave its window at tick {}; the horizon must be at most {last}",
                self.horizon,
                last + 1
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Values in the state

/// A location document with a precomputed fingerprint: `LocationDocument` has no `Hash`,
/// so a document is identified by a hash of its canonical JSON (every field, in
/// declaration order), computed once when the document is made.
#[derive(Clone)]
pub struct Doc {
    doc: Arc<LocationDocument>,
    fp: u64,
}

impl Doc {
    fn new(doc: LocationDocument) -> Self {
        let json = serde_json::to_string(&doc).expect("a location document serializes");
        let mut h = std::hash::DefaultHasher::new();
        json.hash(&mut h);
        Self { doc: Arc::new(doc), fp: h.finish() }
    }
}

impl Hash for Doc {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.fp);
    }
}

impl PartialEq for Doc {
    fn eq(&self, other: &Self) -> bool {
        self.fp == other.fp
    }
}
impl Eq for Doc {}

impl fmt::Debug for Doc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe_doc(&self.doc))
    }
}

/// A note on the step that made a state, for traces; ignored by hashing and equality so
/// it never splits states.
#[derive(Clone, Default)]
pub struct Note(pub String);
impl Hash for Note {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}
impl PartialEq for Note {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Note {}
impl fmt::Debug for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One committed version of the document.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    /// As written.
    pub raw: Doc,
    /// As every reader takes it: `settle(raw, committed)`.
    pub settled: Doc,
    /// Its ETag number.
    pub etag: u16,
    /// Commit tick (store clock = true clock).
    pub committed: u8,
    /// When a later version replaced it.
    pub superseded: Option<u8>,
}

/// A write sent to the store and not yet committed or dropped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InFlight {
    /// Which orchestrator's client sent it.
    pub from: u8,
    /// The idempotency key of the call it writes (its record is in `doc`).
    pub key: CallKey,
    /// The document written.
    pub doc: Doc,
    /// If-Match ETag; `None` for a write that ignores it (the broken swap).
    pub if_match: Option<u16>,
    /// The client gave up on it (timeout): its answer goes nowhere.
    pub abandoned: bool,
    /// It has crossed a tick (counted once against the delay budget).
    pub delayed: bool,
}

/// The user item, at one location.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Item {
    /// A value (write number).
    Value(u8),
    /// Deleted under a hard-delete lock.
    Tombstone,
}

/// A cache entry of one instance (one tier).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The settled document and its version.
    pub doc: Doc,
    /// ETag number.
    pub etag: u16,
    /// Commit tick of that version.
    pub committed: u8,
    /// Local fetch time.
    pub fetched: DateTime<Utc>,
    /// `freshness::serve_until` at the fetch.
    pub serve_until: DateTime<Utc>,
}

/// What an orchestrator calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Pre-lock (no declared target).
    PreLock,
    /// Escalate to this phase.
    Escalate(Phase),
    /// Renew (the n-th renewal of this migration).
    Renew(u8),
    /// Swap to this location (index).
    Swap(u8),
    /// Release.
    Release,
}

/// Where the modelled `RoutingClient::call` loop is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// About to read the write region and decide; `unresolved` is the ETag an earlier
    /// write whose outcome is unknown was conditional on.
    Ready { unresolved: Option<u16> },
    /// A write is in flight, conditional on `condition`, sent at local time `sent`.
    Waiting { condition: u16, next: Doc, sent: DateTime<Utc> },
    /// The write committed; the acknowledgement is on its way (late).
    Acked { condition: u16, next: Doc, etag: u16, committed: u8, sent: DateTime<Utc> },
}

/// What an orchestrator believes it holds (from acknowledged answers only).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    /// Its token.
    pub token: LockToken,
    /// Phase as last acknowledged.
    pub phase: Phase,
    /// Lease end as last acknowledged (lowered while an escalation is unresolved).
    pub expires: DateTime<Utc>,
    /// effectiveAt.
    pub effective: DateTime<Utc>,
}

/// Where the swap handler of an orchestrator's swap request is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SwapStage {
    /// `prepare_swap` decided the swap would be accepted; waiting until `quiet`. `before`
    /// is the target's item as the handler saw it before `prepare_swap` read the document.
    Prepared { source: u8, target: u8, quiet: DateTime<Utc>, before: Option<Item> },
    /// Items copied; the swap call comes next.
    Copied { target: u8 },
}

/// One orchestrator.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Orch {
    /// Current migration (0-based).
    pub attempt: u8,
    /// The current migration ended (swapped, released or lost its lock).
    pub finished: bool,
    /// The lock it holds, as acknowledged.
    pub held: Option<Held>,
    /// A call in progress.
    pub call: Option<(Step, Client)>,
    /// A call answered outcome-unknown: the next request repeats it with the same key.
    pub retry: Option<Step>,
    /// Pre-lock requests answered outcome-unknown in this migration (each request the
    /// service receives makes a new token; a refused one leaves none behind).
    pub unknown_prelocks: u8,
    /// Renewals made in this migration.
    pub renewals: u8,
    /// The swap handler's progress.
    pub swap: Option<SwapStage>,
    /// A swap or release was sent and not yet answered for good: the lock is being
    /// handed over (it may already be gone from the document).
    pub handing_over: bool,
}

/// Where the operator's force-release is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    /// Nothing asked.
    Idle,
    /// Requested (recorded in the document), not yet approved.
    Requested,
    /// Approved on the version with ETag `if_match`; the write `next` is on its way.
    Approving { next: Doc, if_match: u16 },
    /// The approval's write landed (released or void).
    Done,
}

/// Violations seen (events), as bits.
pub mod violation {
    /// A user write (or tombstone) was accepted while an effective write lock forbade it.
    pub const WRITE_UNDER_LOCK: u8 = 1;
    /// A physical delete was accepted while an effective hard-delete or write lock forbade it.
    pub const DELETE_UNDER_LOCK: u8 = 2;
    /// A user write or delete was routed to a location other than the authoritative one.
    pub const STALE_ROUTE: u8 = 4;
    /// A keyed call took effect a second time: a commit applied a key that an earlier
    /// commit had applied already (a repeat acted again instead of replaying).
    pub const APPLIED_TWICE: u8 = 8;
    /// A lock call of a token whose lock a force-release had removed took effect.
    pub const FENCED_ACTED: u8 = 16;
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// True time (tick).
    pub now: u8,
    /// Clock offset of each instance (ticks).
    pub skew: Vec<i8>,
    /// Committed versions still visible to a replica; the last is current.
    pub versions: Vec<Version>,
    /// The next ETag number.
    pub next_etag: u16,
    /// Writes in flight.
    pub inflight: Vec<InFlight>,
    /// Each instance's cache.
    pub caches: Vec<Option<Entry>>,
    /// The item at each location.
    pub data: [Option<Item>; 2],
    /// What the users were told last (the item as they must see it).
    pub ghost: Option<Item>,
    /// User requests made.
    pub requests: u8,
    /// User writes accepted.
    pub writes: u8,
    /// User deletes made.
    pub deletes: u8,
    /// Orchestrators.
    pub orchs: Vec<Orch>,
    /// Fault budget used.
    pub delayed_used: u8,
    /// Fault budget used.
    pub ambiguous_used: u8,
    /// Violation events (see [`violation`]).
    pub violations: u8,
    /// The idempotency keys whose call took effect (committed, not void), one bit each
    /// (`LockModel::key_bit`). In the fixed protocol these are the keys recorded in the
    /// current document (no record leaves its window within the horizon), so it splits
    /// no states there.
    pub applied: u64,
    /// Some keyed call was refused because the document keeps as many records as it may.
    pub records_full: bool,
    /// Some orchestrator's swap was acknowledged.
    pub swapped: bool,
    /// Some pre-lock answered outcome-unknown was granted on a retry with the same key.
    pub ambiguous_prelock_settled: bool,
    /// The operator's force-release.
    pub operator: Operator,
    /// A force-release removed a lock whose holder went on (its token is fenced).
    pub force_released: bool,
    /// What the last step did.
    pub note: Note,
}

/// A user operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UserOp {
    /// Read the item (fills caches).
    Read,
    /// Write a new value.
    Write,
    /// Delete the item.
    Delete,
}

/// How a commit is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ack {
    /// At once.
    Now,
    /// Later (a separate delivery step).
    Late,
    /// Never: the client hears outcome-unknown.
    Lost,
}

/// A step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time advances one tick.
    Tick,
    /// Orchestrator starts (or repeats) a call.
    Call(u8, Step),
    /// Orchestrator's client runs the next iteration of its loop.
    Continue(u8),
    /// Orchestrator's swap request: `prepare_swap`.
    Prepare(u8),
    /// Orchestrator's swap handler copies the items.
    Copy(u8),
    /// The store processes in-flight write `n`.
    Commit(u8, Ack),
    /// A late acknowledgement reaches orchestrator's client.
    Deliver(u8),
    /// Orchestrator's client times out on its write.
    Timeout(u8),
    /// The store drops abandoned write `n` (it never lands).
    Drop(u8),
    /// A user operation on an instance; `replica` picks the replica's version if the
    /// resolve reads one.
    User(u8, UserOp, u8),
    /// The operator requests a force-release of the live lock.
    ForceRequest,
    /// A second principal approves it (decided on the current version).
    ForceApprove,
    /// The approval's write reaches the store.
    ForceCommit,
}

/// Sets the note of the step being taken (only when narrating a trace: formatting
/// costs more than the step).
macro_rules! say {
    ($model:expr, $s:expr, $($arg:tt)*) => {
        if $model.narrate {
            $s.note = Note(format!($($arg)*));
        }
    };
}

/// Adds to the note of the step being taken.
macro_rules! add {
    ($model:expr, $s:expr, $($arg:tt)*) => {
        if $model.narrate {
            let more = format!($($arg)*);
            $s.note.0.push_str(&more);
        }
    };
}

// ---------------------------------------------------------------------------------------
// Time

/// 2026-01-01T00:00:00Z, tick 0.
fn base() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).expect("a valid instant")
}

/// Tick `t` (possibly skewed) as an instant.
pub fn at(t: i16) -> DateTime<Utc> {
    base() + TimeDelta::seconds(t as i64)
}

/// An instant as a tick relative to the base (for traces).
pub fn tick_of(t: DateTime<Utc>) -> String {
    if t == DateTime::<Utc>::MAX_UTC {
        return "∞".into();
    }
    let ms = (t - base()).num_milliseconds();
    if ms % 1000 == 0 {
        format!("{}", ms / 1000)
    } else {
        format!("{:.3}", ms as f64 / 1000.0)
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// ---------------------------------------------------------------------------------------
// The store the real resolve reads

/// The store as one resolve sees it: the write region's current version and the version
/// a replica serves (both already settled: `settle` is idempotent, so the client's own
/// `settle` of them changes nothing and costs no digest).
#[derive(Debug)]
struct Snapshot {
    write_region: Versioned,
    replica: Versioned,
}

#[async_trait]
impl LocationStore for Snapshot {
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        if id != ID {
            return Err(StoreError::NotFound);
        }
        Ok(match from {
            ReadFrom::WriteRegion => self.write_region.clone(),
            ReadFrom::Replica => self.replica.clone(),
        })
    }
    async fn create(&self, _: &LocationDocument) -> Result<Committed, StoreError> {
        Err(StoreError::Unavailable("the model's resolve never writes".into()))
    }
    async fn replace(&self, _: &LocationDocument, _: &ETag) -> Result<Committed, StoreError> {
        Err(StoreError::Unavailable("the model's resolve never writes".into()))
    }
    async fn read_changes(&self, _: &ChangeCursor, _: usize) -> Result<ChangeBatch, StoreError> {
        Err(StoreError::Unavailable("not modelled".into()))
    }
    async fn scan(&self, _: Option<&str>, _: usize) -> Result<ScanPage, StoreError> {
        Err(StoreError::Unavailable("not modelled".into()))
    }
}

fn etag(n: u16) -> ETag {
    ETag(format!("e{n}"))
}

fn etag_number(e: &ETag) -> u16 {
    e.0[1..].parse().expect("model etags are e<n>")
}

// ---------------------------------------------------------------------------------------
// The model

/// The model of one variant at some bounds. Pure functions of the routing library are
/// memoised (they are pure, so this changes nothing but the time taken).
pub struct LockModel {
    /// The design checked.
    pub variant: Variant,
    /// The bounds.
    pub bounds: Bounds,
    policy: LockPolicy,
    /// Write notes on each step (for traces).
    narrate: bool,
    settle_memo: Mutex<HashMap<(u64, u8), Doc>>,
    decide_memo: Mutex<HashMap<DecideKey, Result<Option<Doc>, LockError>>>,
    resolve_memo: Mutex<HashMap<ResolveKey, (Source, u16)>>,
}

/// The inputs of one resolve: the cache entry, the write region's version, the
/// replica's version (fingerprint, ETag, commit tick) and the local time.
type ResolveKey = (Option<Entry>, (u64, u16, u8), (u64, u16, u8), DateTime<Utc>);

/// The inputs of one decision: the document, the local time, and who calls what with
/// which token (orchestrator, migration, step, pre-lock request number, presented token).
type DecideKey = (u64, i16, (u8, u8, u8, u8), Option<LockToken>);

/// What a lock call returned to the orchestrator.
enum Answer {
    Ok(Doc),
    Err(LockError),
    Unknown,
}

impl LockModel {
    /// The model of `variant` at `bounds`.
    pub fn new(variant: Variant, bounds: Bounds) -> Self {
        let policy = LockPolicy {
            convergence_delay: secs(timing::TTL + timing::REPLICATION),
            max_pre_lock: secs(timing::MAX_PRE_LOCK),
            skew_margin: secs(timing::SKEW_MARGIN),
            keyed_records: bounds.keyed_records,
            write_format: variant.write_format(),
            force_release_window: secs(60),
            deviations: variant.deviations(),
        };
        if let Err(refused) = bounds.validate(variant) {
            panic!("{refused}");
        }
        Self {
            variant,
            bounds,
            policy,
            narrate: false,
            settle_memo: Mutex::default(),
            decide_memo: Mutex::default(),
            resolve_memo: Mutex::default(),
        }
    }

    fn settle(&self, raw: &Doc, committed: u8) -> Doc {
        let key = (raw.fp, committed);
        if let Some(d) = self.settle_memo.lock().unwrap().get(&key) {
            return d.clone();
        }
        let settled = lifecycle::settle((*raw.doc).clone(), at(committed as i16));
        let settled = if settled == *raw.doc { raw.clone() } else { Doc::new(settled) };
        self.settle_memo.lock().unwrap().insert(key, settled.clone());
        settled
    }

    fn decide(&self, doc: &Doc, o: u8, orch: &Orch, step: Step, now: DateTime<Utc>) -> Result<Option<Doc>, LockError> {
        let local = ((now - base()).num_seconds()) as i16;
        let who = (o, orch.attempt, step_code(step), orch.unknown_prelocks);
        let memo_key = (doc.fp, local, who, orch.held.as_ref().map(|h| h.token.clone()));
        if let Some(r) = self.decide_memo.lock().unwrap().get(&memo_key) {
            return r.clone();
        }
        let key = call_key(o, orch, step);
        let call = lock_call(o, orch, step);
        let result = lifecycle::decide(&doc.doc, &call, &key, &self.policy, now).map(|d| match d {
            Decided::Replayed => None,
            Decided::Write(next) => Some(Doc::new(*next)),
        });
        self.decide_memo.lock().unwrap().insert(memo_key, result.clone());
        result
    }

    /// The bits of `State::applied` of every key whose (migration, slot) `pick` takes.
    fn slot_mask(&self, pick: impl Fn(u8, u8) -> bool) -> u64 {
        let mut mask = 0;
        for o in 0..self.bounds.orchestrators {
            for attempt in 0..self.bounds.attempts {
                for slot in 0..5 + self.bounds.renewals {
                    if pick(attempt, slot) {
                        mask |= self.key_bit(CallKey { o, attempt, slot });
                    }
                }
            }
        }
        mask
    }

    /// The bit of `State::applied` that stands for `key`.
    fn key_bit(&self, key: CallKey) -> u64 {
        let per_migration = 5 + self.bounds.renewals as u32;
        let migration = key.o as u32 * self.bounds.attempts as u32 + key.attempt as u32;
        1 << (migration * per_migration + key.slot as u32)
    }

    fn local(&self, s: &State, instance: u8) -> DateTime<Utc> {
        at(s.now as i16 + s.skew[instance as usize] as i16)
    }

    fn instance_of(&self, o: u8) -> u8 {
        o % self.bounds.instances
    }

    /// The current version, settled: what holds now.
    pub fn current<'a>(&self, s: &'a State) -> &'a Version {
        s.versions.last().expect("the document always exists")
    }

    fn initial(&self, skew: Vec<i8>) -> State {
        let doc = Doc::new(LocationDocument::new(ID, LOCATIONS[0]));
        let orch = Orch {
            attempt: 0,
            finished: false,
            held: None,
            call: None,
            retry: None,
            unknown_prelocks: 0,
            renewals: 0,
            swap: None,
            handing_over: false,
        };
        State {
            now: 0,
            skew,
            versions: vec![Version { raw: doc.clone(), settled: doc, etag: 0, committed: 0, superseded: None }],
            next_etag: 1,
            inflight: Vec::new(),
            caches: vec![None; self.bounds.instances as usize],
            data: [Some(Item::Value(0)), None],
            ghost: Some(Item::Value(0)),
            requests: 0,
            writes: 0,
            deletes: 0,
            orchs: vec![orch; self.bounds.orchestrators as usize],
            delayed_used: 0,
            ambiguous_used: 0,
            violations: 0,
            applied: 0,
            records_full: false,
            swapped: false,
            ambiguous_prelock_settled: false,
            operator: Operator::Idle,
            force_released: false,
            note: Note("start".into()),
        }
    }
}

fn step_code(step: Step) -> u8 {
    match step {
        Step::PreLock => 0,
        Step::Escalate(Phase::HardDelete) => 1,
        Step::Escalate(_) => 2,
        Step::Renew(n) => 10 + n,
        Step::Swap(t) => 30 + t,
        Step::Release => 50,
    }
}

fn step_name(step: Step) -> String {
    match step {
        Step::PreLock => "pre-lock".into(),
        Step::Escalate(p) => format!("escalate to {p}"),
        Step::Renew(_) => "renew".into(),
        Step::Swap(t) => format!("swap to {}", LOCATIONS[t as usize]),
        Step::Release => "release".into(),
    }
}

/// The idempotency key of a call: one per step of a migration, reused by its retries
/// (a swap's key names no target: a repeated swap request is the same request).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallKey {
    /// The orchestrator.
    pub o: u8,
    /// Its migration.
    pub attempt: u8,
    /// The step: 0 pre-lock, 1 escalate to hardDelete, 2 escalate to write, 3 swap,
    /// 4 release, 5 + n the n-th renewal.
    pub slot: u8,
}

impl CallKey {
    fn of(o: u8, orch: &Orch, step: Step) -> Self {
        let slot = match step {
            Step::PreLock => 0,
            Step::Escalate(Phase::HardDelete) => 1,
            Step::Escalate(_) => 2,
            Step::Swap(_) => 3,
            Step::Release => 4,
            Step::Renew(n) => 5 + n,
        };
        Self { o, attempt: orch.attempt, slot }
    }

    /// The key as sent: `k:o<orchestrator>m<migration>-<step>`.
    pub fn name(self) -> String {
        let what = match self.slot {
            0 => "pre".to_string(),
            1 => "hd".into(),
            2 => "wr".into(),
            3 => "swap".into(),
            4 => "rel".into(),
            n => format!("renew{}", n - 5),
        };
        format!("k:o{}m{}-{what}", self.o, self.attempt)
    }
}

/// The idempotency key of a call, as sent.
fn call_key(o: u8, orch: &Orch, step: Step) -> String {
    CallKey::of(o, orch, step).name()
}

/// The token a pre-lock request issues (the service makes a new one per request) or the
/// one a later call presents.
fn lock_call(o: u8, orch: &Orch, step: Step) -> LockCall {
    let presented = || orch.held.as_ref().map(|h| h.token.clone()).unwrap_or_else(|| LockToken::from_presented("none"));
    match step {
        Step::PreLock => LockCall::PreLock {
            request: PreLockRequest { owner: format!("o{o}"), duration: secs(timing::PRE_LOCK), target_location: None },
            token: LockToken::from_presented(format!("o{o}m{}r{}", orch.attempt, orch.unknown_prelocks)),
        },
        Step::Escalate(phase) => LockCall::Escalate { token: presented(), phase, duration: secs(timing::ESCALATE) },
        Step::Renew(_) => LockCall::Renew { token: presented(), duration: secs(timing::RENEW) },
        Step::Swap(t) => LockCall::Swap { token: presented(), target: LOCATIONS[t as usize].into() },
        Step::Release => LockCall::Release { token: presented() },
    }
}

fn location_index(name: &str) -> u8 {
    LOCATIONS.iter().position(|l| *l == name).expect("model locations") as u8
}

impl LockModel {
    // -----------------------------------------------------------------------------------
    // Orchestrators and the client loop

    /// A new request from orchestrator `o`: the first iteration of the client loop.
    fn start_call(&self, s: &mut State, o: u8, step: Step) {
        let orch = &mut s.orchs[o as usize];
        if orch.finished {
            // A new migration.
            orch.attempt += 1;
            orch.finished = false;
            orch.held = None;
            orch.unknown_prelocks = 0;
            orch.renewals = 0;
        }
        orch.retry = None;
        if matches!(step, Step::Swap(_) | Step::Release) {
            orch.handing_over = true;
        }
        if let (Step::Escalate(_), Some(held)) = (step, orch.held.as_mut()) {
            // An escalation sets a new lease from its decide time: until its answer, the
            // orchestrator counts on no more than that.
            let local = at(s.now as i16 + s.skew[(o % self.bounds.instances) as usize] as i16);
            held.expires = held.expires.min(local + TimeDelta::seconds(timing::ESCALATE as i64));
        }
        s.orchs[o as usize].call = Some((step, Client::Ready { unresolved: None }));
        self.client_iteration(s, o);
    }

    /// One iteration of `RoutingClient::call` (src/routing/client.rs): read the write
    /// region, settle, resolve an earlier unknown outcome, decide, write If-Match.
    fn client_iteration(&self, s: &mut State, o: u8) {
        let Some((step, Client::Ready { unresolved })) = s.orchs[o as usize].call.clone() else {
            unreachable!("only a ready client iterates")
        };
        let current = self.current(s).clone();
        let key = call_key(o, &s.orchs[o as usize], step);
        if unresolved == Some(current.etag) && !lifecycle::took_effect(&current.settled.doc, &key) {
            // Still at the version the write needs: it may land yet.
            self.answer(s, o, step, Answer::Unknown);
            return;
        }
        let now = self.local(s, self.instance_of(o));
        match self.decide(&current.settled, o, &s.orchs[o as usize], step, now) {
            Err(e) => self.answer(s, o, step, Answer::Err(e)),
            Ok(None) => self.answer(s, o, step, Answer::Ok(current.settled.clone())),
            Ok(Some(next)) => {
                let blind = self.variant == Variant::SwapWithoutIfMatch && matches!(step, Step::Swap(_));
                s.inflight.push(InFlight {
                    from: o,
                    key: CallKey::of(o, &s.orchs[o as usize], step),
                    doc: next.clone(),
                    if_match: (!blind).then_some(current.etag),
                    abandoned: false,
                    delayed: false,
                });
                s.orchs[o as usize].call = Some((step, Client::Waiting { condition: current.etag, next, sent: now }));
                add!(self, s, "; decided at local {} on e{}, write sent", tick_of(now), current.etag);
            }
        }
    }

    /// `RoutingClient::judge`: the written version as every reader takes it; cached by
    /// the calling instance as fetched when the write was sent (`sent`); a call that did
    /// not take effect hears that the lease expired.
    #[allow(clippy::too_many_arguments)]
    fn judge(&self, s: &mut State, o: u8, step: Step, next: &Doc, etag: u16, committed: u8, sent: DateTime<Utc>) {
        let settled = self.settle(next, committed);
        let instance = self.instance_of(o);
        self.remember(s, instance, settled.clone(), etag, committed, sent);
        let key = call_key(o, &s.orchs[o as usize], step);
        if lifecycle::took_effect(&settled.doc, &key) {
            self.answer(s, o, step, Answer::Ok(settled));
        } else {
            let expired_at =
                next.doc.pending.as_ref().and_then(|p| p.void_if_committed_after).unwrap_or(at(committed as i16));
            self.answer(s, o, step, Answer::Err(LockError::LeaseExpired { expired_at }));
        }
    }

    /// `RoutingClient::remember`: cache a settled document fetched at `fetched` (local).
    fn remember(&self, s: &mut State, instance: u8, doc: Doc, etag: u16, committed: u8, fetched: DateTime<Utc>) {
        let serve_until = freshness::serve_until(&doc.doc, fetched, &self.policy);
        s.caches[instance as usize] = Some(Entry { doc, etag, committed, fetched, serve_until });
    }

    /// The orchestrator hears the answer to its request.
    fn answer(&self, s: &mut State, o: u8, step: Step, answer: Answer) {
        let orch = &mut s.orchs[o as usize];
        orch.call = None;
        let note = match answer {
            Answer::Unknown => {
                orch.retry = Some(step);
                if step == Step::PreLock {
                    orch.unknown_prelocks += 1;
                }
                orch.swap = None;
                "503 outcome-unknown".to_string()
            }
            Answer::Err(e) => {
                orch.swap = None;
                orch.handing_over = false;
                match e {
                    // Too early, held by another, or no room for the key's record:
                    // nothing happened; try again later.
                    LockError::RecordsFull { .. } => s.records_full = true,
                    LockError::InvalidTransition(_) | LockError::LockHeld { .. } => {}
                    LockError::LeaseExpired { .. }
                    | LockError::LapsedAndReplaced
                    | LockError::TokenMismatch
                    | LockError::ForceReleased { .. } => {
                        orch.held = None;
                        orch.finished = true;
                    }
                    LockError::InvalidRequest(m) => panic!("the model made an invalid request: {m}"),
                    LockError::KeyReused => panic!("the model reused a key for another request"),
                    other => panic!("a lock call answered with a force-release refusal: {other}"),
                }
                format!("refused: {e}")
            }
            Answer::Ok(doc) => {
                let answered_prelock = step == Step::PreLock && orch.unknown_prelocks > 0;
                match step {
                    Step::Swap(_) | Step::Release => {
                        orch.handing_over = false;
                        orch.held = None;
                        orch.finished = true;
                        orch.swap = None;
                        if matches!(step, Step::Swap(_)) {
                            s.swapped = true;
                        }
                    }
                    Step::PreLock | Step::Escalate(_) | Step::Renew(_) => {
                        // The lock view: the document's primary lock (`grant` takes the
                        // token from it, so a replay hands back the first call's token).
                        let Some(lock) = doc.doc.primary.lock.as_ref() else {
                            orch.held = None;
                            orch.finished = true;
                            add!(self, s, "; answered without a lock");
                            return;
                        };
                        orch.held = Some(Held {
                            token: lock.token.clone(),
                            phase: lock.phase,
                            expires: lock.expires_at,
                            effective: lock.effective_at,
                        });
                        if let Step::Renew(_) = step {
                            orch.renewals += 1;
                        }
                        if answered_prelock {
                            s.ambiguous_prelock_settled = true;
                        }
                    }
                }
                match doc.doc.primary.lock.as_ref() {
                    Some(l) if !matches!(step, Step::Swap(_) | Step::Release) => format!(
                        "ok: {} token {} effective {} expires {}",
                        l.phase,
                        l.token.expose(),
                        tick_of(l.effective_at),
                        tick_of(l.expires_at)
                    ),
                    _ => format!("ok: location {}", doc.doc.primary.location),
                }
            }
        };
        add!(self, s, "; o{o} {} answered {note}", step_name(step));
    }

    /// `prepare_swap` (src/routing/client.rs): the swap would be accepted now; wait until
    /// no decision made before the write lock began can still apply.
    /// The target is the other location, or, when the request is repeated, the one asked
    /// for the first time (the request, and so its key, is the same).
    fn prepare(&self, s: &mut State, o: u8) {
        let current = self.current(s).clone();
        let orch = s.orchs[o as usize].clone();
        s.orchs[o as usize].retry = None;
        let source = location_index(&current.settled.doc.primary.location);
        let target = match orch.retry {
            Some(Step::Swap(t)) => t,
            _ => 1 - source,
        };
        // The handler looks at the target before it reads the document (lock_api.rs).
        let before = s.data[target as usize];
        let step = Step::Swap(target);
        let now = self.local(s, self.instance_of(o));
        match self.decide(&current.settled, o, &orch, step, now) {
            Err(e) => self.answer(s, o, step, Answer::Err(e)),
            Ok(None) => self.answer(s, o, step, Answer::Ok(current.settled.clone())),
            Ok(Some(_)) => {
                let lock = current.settled.doc.primary.lock.as_ref();
                let since = lock.and_then(|l| l.phase_since).unwrap_or(at(current.committed as i16));
                let quiet = since + TimeDelta::seconds((timing::DECISION_AGE + timing::SKEW_MARGIN) as i64);
                s.orchs[o as usize].swap = Some(SwapStage::Prepared { source, target, quiet, before });
                add!(self, s, "; copy from {} at local {} or later", LOCATIONS[source as usize], tick_of(quiet));
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // User operations

    /// A user operation on `instance`: the real resolve, the real enforcement, and the
    /// reference service's item store (src/service/data_api.rs, items.rs).
    /// The operator asks for the live lock to be force-released: `RoutingClient::
    /// force_release` with a request, decided on the current version at true time and
    /// written at once (its faults are the campaign's: here it is the approval whose
    /// timing matters).
    fn force_request(&self, s: &mut State) {
        let current = self.current(s).clone();
        let lock = current.settled.doc.primary.lock.as_ref().expect("offered only under a live lock");
        let call = AdminCall::Request(ForceReleaseRequest {
            id: "fr".into(),
            lock: lock.token.digest(),
            phase: lock.phase,
            requested_by: "alice".into(),
            reason: "stuck".into(),
        });
        match force_release::decide(&current.settled.doc, &call, &self.policy, at(s.now as i16)) {
            Ok(Decided::Write(next)) => {
                let next = Doc::new(*next);
                self.operator_commit(s, next);
                s.operator = Operator::Requested;
                add!(self, s, "; alice requests a force-release of the {} lock", lock.phase);
            }
            other => panic!("a force-release request on a live lock was not written: {other:?}"),
        }
    }

    /// A second principal approves: decided on the current version; the write follows.
    fn force_approve(&self, s: &mut State) {
        let current = self.current(s).clone();
        let call = AdminCall::Approve { id: "fr".into(), principal: "bob".into() };
        match force_release::decide(&current.settled.doc, &call, &self.policy, at(s.now as i16)) {
            Ok(Decided::Write(next)) => {
                s.operator = Operator::Approving { next: Doc::new(*next), if_match: current.etag };
                say!(self, s, "t={} bob approves the force-release on e{}", s.now, current.etag);
            }
            // Expired: the window is longer than the horizon. Replayed: only after Done.
            other => panic!("an approval was not decided: {other:?}"),
        }
    }

    /// The approval's write reaches the store: If-Match the version it was decided on (a
    /// 412 re-reads and decides again, as `RoutingClient::force_release` does), or
    /// blindly in the broken variant.
    fn force_commit(&self, s: &mut State) {
        let Operator::Approving { next, if_match } = s.operator.clone() else { unreachable!() };
        let blind = self.variant == Variant::ForceReleaseWithoutIfMatch;
        if !blind && self.current(s).etag != if_match {
            s.operator = Operator::Requested;
            say!(self, s, "t={} store refuses the approval's write: 412; deciding again", s.now);
            return;
        }
        let released = next.doc.force_releases.iter().any(|r| r.outcome == lockprobe::document::ForceOutcome::Released);
        let holder_on = s.orchs.iter().any(|o| o.held.is_some());
        self.operator_commit(s, next);
        s.operator = Operator::Done;
        if released && holder_on {
            s.force_released = true;
        }
        add!(self, s, "; the approval lands ({})", if released { "lock removed" } else { "void" });
    }

    /// Commits an operator's write as the next version, at once.
    fn operator_commit(&self, s: &mut State, next: Doc) {
        let etag = s.next_etag;
        s.next_etag += 1;
        let settled = self.settle(&next, s.now);
        if let Some(last) = s.versions.last_mut() {
            last.superseded = Some(s.now);
        }
        say!(self, s, "t={} store commits the operator's write as e{etag}: {:?}", s.now, settled);
        s.versions.push(Version { raw: next, settled, etag, committed: s.now, superseded: None });
    }

    fn user(&self, s: &mut State, instance: u8, op: UserOp, replica: u8) {
        s.requests += 1;
        let local = self.local(s, instance);
        let current = self.current(s).clone();
        let replica_version = self.replica_versions(s)[replica as usize].clone();
        let entry = s.caches[instance as usize].clone();
        let (source, read) = self.resolve(entry.clone(), &current, &replica_version, local);
        let doc = if source == Source::Cache {
            entry.expect("served from the cache").doc
        } else {
            // The client cached what it read (`remember`), fetched at `local`.
            let v = s.versions.iter().find(|v| v.etag == read).expect("a version the model holds").clone();
            self.remember(s, instance, v.settled.clone(), v.etag, v.committed, local);
            v.settled
        };
        let lock = doc.doc.primary.lock.as_ref();
        let location = location_index(&doc.doc.primary.location);
        let decision = match op {
            UserOp::Read => Decision::Allow,
            UserOp::Write => enforce(Operation::Write, lock, local, self.policy.skew_margin),
            UserOp::Delete => enforce(Operation::Delete, lock, local, self.policy.skew_margin),
        };
        let before = s.data[location as usize];
        let outcome = match (op, decision) {
            (UserOp::Read, _) => format!("read {:?}", before),
            (_, Decision::Block { .. }) => "423 locked".into(),
            (UserOp::Write, _) => {
                s.writes += 1;
                let item = Item::Value(s.writes);
                s.data[location as usize] = Some(item);
                s.ghost = Some(item);
                self.judge_user_change(s, location, false);
                format!("write {} accepted", s.writes)
            }
            (UserOp::Delete, Decision::Tombstone) => {
                s.deletes += 1;
                if before.is_some() {
                    s.data[location as usize] = Some(Item::Tombstone);
                    s.ghost = Some(Item::Tombstone);
                    self.judge_user_change(s, location, false);
                    "202 tombstoned".into()
                } else {
                    "404".into()
                }
            }
            (UserOp::Delete, _) => {
                s.deletes += 1;
                if before.is_some() {
                    s.data[location as usize] = None;
                    s.ghost = None;
                    self.judge_user_change(s, location, true);
                    "204 deleted physically".into()
                } else {
                    "404".into()
                }
            }
        };
        say!(
            self,
            s,
            "t={} inst{} (local {}) user {:?} via {} e{} -> {}: {outcome}",
            s.now,
            instance,
            tick_of(local),
            op,
            source.as_str(),
            read,
            LOCATIONS[location as usize]
        );
    }

    /// The real `RoutingClient::resolve` over one cache entry, the write region's current
    /// version and a replica's version, at `local`: which way it went and what it read.
    fn resolve(
        &self,
        entry: Option<Entry>,
        current: &Version,
        replica: &Version,
        local: DateTime<Utc>,
    ) -> (Source, u16) {
        let id = |v: &Version| (v.raw.fp, v.etag, v.committed);
        let key = (entry.clone(), id(current), id(replica), local);
        if let Some(r) = self.resolve_memo.lock().unwrap().get(&key) {
            return *r;
        }
        let versioned = |v: &Version| Versioned {
            doc: (*v.settled.doc).clone(),
            etag: etag(v.etag),
            committed_at: at(v.committed as i16),
        };
        let store = Arc::new(Snapshot { write_region: versioned(current), replica: versioned(replica) });
        let cache = TieredCache::try_new(&[secs(timing::TTL)]).expect("one tier");
        if let Some(e) = &entry {
            let record = Arc::new(Versioned {
                doc: (*e.doc.doc).clone(),
                etag: etag(e.etag),
                committed_at: at(e.committed as i16),
            });
            cache.put(ID, record, lockprobe::clock::unix_nanos(e.fetched), lockprobe::clock::unix_nanos(e.serve_until));
        }
        let clock = Arc::new(ManualClock::new(local));
        let options = ClientOptions { retry_budget: 8, max_decision_age: secs(1) };
        let client = RoutingClient::new(store, clock, cache, self.policy.clone(), options);
        let resolved = futures::executor::block_on(client.resolve(ID)).expect("the model's store always answers");
        let answer = (resolved.source, etag_number(&resolved.record.etag));
        self.resolve_memo.lock().unwrap().insert(key, answer);
        answer
    }

    /// The oracle for an accepted change, judged in true time against what holds now.
    fn judge_user_change(&self, s: &mut State, location: u8, physical_delete: bool) {
        let now = at(s.now as i16);
        let current = self.current(s).settled.clone();
        if location_index(&current.doc.primary.location) != location {
            s.violations |= violation::STALE_ROUTE;
        }
        if let Some(lock) = current.doc.primary.lock.as_ref().filter(|l| l.is_live(now)) {
            match lock.phase {
                Phase::Write if physical_delete => s.violations |= violation::DELETE_UNDER_LOCK,
                Phase::Write => s.violations |= violation::WRITE_UNDER_LOCK,
                Phase::HardDelete if physical_delete => s.violations |= violation::DELETE_UNDER_LOCK,
                _ => {}
            }
        }
    }

    /// The versions a replica may serve now: current at some instant within the bound.
    pub fn replica_versions<'a>(&self, s: &'a State) -> Vec<&'a Version> {
        let oldest = s.now as i16 - timing::REPLICATION as i16;
        s.versions.iter().filter(|v| v.superseded.is_none_or(|t| t as i16 >= oldest)).rev().collect()
    }

    // -----------------------------------------------------------------------------------
    // The store

    fn commit(&self, s: &mut State, n: u8, ack: Ack) {
        let w = s.inflight.remove(n as usize);
        let current_etag = self.current(s).etag;
        let matches = w.if_match.is_none_or(|e| e == current_etag);
        let o = w.from;
        let step = s.orchs[o as usize].call.as_ref().map(|(step, _)| *step);
        if !matches {
            say!(
                self,
                s,
                "t={} store refuses o{o}'s write: 412 (If-Match e{:?}, current e{current_etag})",
                s.now,
                w.if_match.unwrap_or(0)
            );
            if !w.abandoned {
                let Some((step, Client::Waiting { .. })) = s.orchs[o as usize].call.clone() else { unreachable!() };
                s.orchs[o as usize].call = Some((step, Client::Ready { unresolved: None }));
            }
            return;
        }
        let fenced_before = {
            let replaced = &self.current(s).settled.doc;
            let key = w.key.name();
            let acted_on = w.doc.doc.operations.iter().find(|r| *r.key == *key).map(|r| r.lock.clone());
            acted_on.is_some_and(|lock| replaced.force_releases.iter().any(|r| r.fences(&lock)))
        };
        let etag = s.next_etag;
        s.next_etag += 1;
        let settled = self.settle(&w.doc, s.now);
        if let Some(last) = s.versions.last_mut() {
            last.superseded = Some(s.now);
        }
        s.versions.push(Version {
            raw: w.doc.clone(),
            settled: settled.clone(),
            etag,
            committed: s.now,
            superseded: None,
        });
        say!(self, s, "t={} store commits o{o}'s write as e{etag}: {:?}", s.now, settled);
        // Whether the call took effect (a void write did not) is judged by the real
        // `took_effect`, as the writer's client judges it.
        if lifecycle::took_effect(&settled.doc, &w.key.name()) {
            if fenced_before {
                s.violations |= violation::FENCED_ACTED;
                add!(self, s, " <- {} acts with a force-released token", w.key.name());
            }
            let bit = self.key_bit(w.key);
            if s.applied & bit != 0 {
                s.violations |= violation::APPLIED_TWICE;
                add!(self, s, " <- {} takes effect a second time", w.key.name());
            }
            s.applied |= bit;
        }
        if w.abandoned {
            add!(self, s, " (its client gave up)");
            return;
        }
        let Some((step, Client::Waiting { condition, next, sent })) = s.orchs[o as usize].call.clone() else {
            unreachable!("a live write has a waiting client: {step:?}")
        };
        match ack {
            Ack::Now => self.judge(s, o, step, &next, etag, s.now, sent),
            Ack::Late => {
                s.delayed_used += 1;
                s.orchs[o as usize].call =
                    Some((step, Client::Acked { condition, next, etag, committed: s.now, sent }));
                add!(self, s, "; acknowledgement delayed");
            }
            Ack::Lost => {
                s.ambiguous_used += 1;
                s.orchs[o as usize].call = Some((step, Client::Ready { unresolved: Some(condition) }));
                add!(self, s, "; acknowledgement lost (client: outcome unknown)");
            }
        }
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // Instance 0 keeps true time; every other instance may run at any of the offsets.
        let mut skews = vec![vec![0i8]];
        for _ in 1..self.bounds.instances {
            skews = skews
                .into_iter()
                .flat_map(|prefix| {
                    self.bounds.skews.iter().map(move |k| {
                        let mut v = prefix.clone();
                        v.push(*k);
                        v
                    })
                })
                .collect();
        }
        skews.into_iter().map(|k| self.initial(k)).collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        if s.violations != 0 {
            return;
        }
        // Time.
        if s.now < b.horizon {
            let crossing = s.inflight.iter().filter(|w| !w.delayed).count();
            if s.delayed_used as usize + crossing <= b.delayed as usize {
                actions.push(Action::Tick);
            }
        }
        // Orchestrators.
        for (o, orch) in s.orchs.iter().enumerate() {
            let o = o as u8;
            match &orch.call {
                Some((_, Client::Ready { .. })) => actions.push(Action::Continue(o)),
                Some((_, Client::Waiting { .. })) => {
                    if s.ambiguous_used < b.ambiguous {
                        actions.push(Action::Timeout(o));
                    }
                }
                Some((_, Client::Acked { .. })) => {
                    actions.push(Action::Deliver(o));
                    if s.ambiguous_used < b.ambiguous {
                        actions.push(Action::Timeout(o));
                    }
                }
                None => match &orch.swap {
                    Some(SwapStage::Prepared { quiet, .. }) => {
                        if self.local(s, self.instance_of(o)) >= *quiet {
                            actions.push(Action::Copy(o));
                        }
                    }
                    Some(SwapStage::Copied { target }) => actions.push(Action::Call(o, Step::Swap(*target))),
                    None => {
                        if let Some(step) = orch.retry {
                            match step {
                                Step::Swap(_) => actions.push(Action::Prepare(o)),
                                _ => actions.push(Action::Call(o, step)),
                            }
                            continue;
                        }
                        match &orch.held {
                            None => {
                                if !orch.finished || orch.attempt + 1 < b.attempts {
                                    actions.push(Action::Call(o, Step::PreLock));
                                }
                            }
                            Some(held) => {
                                match held.phase {
                                    Phase::PreLock => actions.push(Action::Call(o, Step::Escalate(Phase::HardDelete))),
                                    Phase::HardDelete => actions.push(Action::Call(o, Step::Escalate(Phase::Write))),
                                    Phase::Write => actions.push(Action::Prepare(o)),
                                }
                                // Renewal matters where a lapse changes enforcement: once escalated.
                                if orch.renewals < b.renewals && held.phase != Phase::PreLock {
                                    actions.push(Action::Call(o, Step::Renew(orch.renewals)));
                                }
                                if b.release {
                                    actions.push(Action::Call(o, Step::Release));
                                }
                            }
                        }
                    }
                },
            }
        }
        // The store.
        for (n, w) in s.inflight.iter().enumerate() {
            let n = n as u8;
            if w.abandoned {
                actions.push(Action::Commit(n, Ack::Now));
                actions.push(Action::Drop(n));
            } else {
                actions.push(Action::Commit(n, Ack::Now));
                if s.delayed_used < b.delayed {
                    actions.push(Action::Commit(n, Ack::Late));
                }
                if s.ambiguous_used < b.ambiguous {
                    actions.push(Action::Commit(n, Ack::Lost));
                }
            }
        }
        // The operator.
        if b.force_release {
            match &s.operator {
                Operator::Idle => {
                    let now = at(s.now as i16);
                    if self.current(s).settled.doc.primary.lock.as_ref().is_some_and(|l| l.is_live(now)) {
                        actions.push(Action::ForceRequest);
                    }
                }
                Operator::Requested => actions.push(Action::ForceApprove),
                Operator::Approving { .. } => actions.push(Action::ForceCommit),
                Operator::Done => {}
            }
        }
        // Users.
        let replicas = self.replica_versions(s).len() as u8;
        for i in (0..b.instances).filter(|_| !self.users_done(s)) {
            let fresh = s.caches[i as usize]
                .as_ref()
                .is_some_and(|e| self.local(s, i) < e.fetched + TimeDelta::seconds(timing::TTL as i64));
            // A fresh cache entry means no replica read: one choice is enough.
            let choices = if fresh { 1 } else { replicas };
            // A read served from the cache changes nothing but the request count.
            let served = fresh && s.caches[i as usize].as_ref().is_some_and(|e| self.local(s, i) < e.serve_until);
            for r in 0..choices {
                if !served {
                    actions.push(Action::User(i, UserOp::Read, r));
                }
                if s.writes < b.writes {
                    actions.push(Action::User(i, UserOp::Write, r));
                }
                if s.deletes < b.deletes {
                    actions.push(Action::User(i, UserOp::Delete, r));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        s.note = Note(String::new());
        match action {
            Action::Tick => {
                s.now += 1;
                for w in s.inflight.iter_mut().filter(|w| !w.delayed) {
                    w.delayed = true;
                    s.delayed_used += 1;
                }
                // Forget what can no longer matter: versions no replica may serve, cache
                // entries past their TTL (a miss from now on either way).
                let oldest = s.now as i16 - timing::REPLICATION as i16;
                s.versions.retain(|v| v.superseded.is_none_or(|t| t as i16 >= oldest));
                for i in 0..s.caches.len() {
                    let local = self.local(&s, i as u8);
                    if s.caches[i].as_ref().is_some_and(|e| local >= e.fetched + TimeDelta::seconds(timing::TTL as i64))
                    {
                        s.caches[i] = None;
                    }
                }
                say!(self, s, "t={}: tick", s.now);
            }
            Action::Call(o, step) => {
                say!(
                    self,
                    s,
                    "t={} o{o} (inst{}) {} [{}]",
                    s.now,
                    self.instance_of(o),
                    step_name(step),
                    call_key(o, &s.orchs[o as usize], step)
                );
                if let Step::Swap(_) = step {
                    s.orchs[o as usize].swap = None;
                }
                self.start_call(&mut s, o, step);
            }
            Action::Continue(o) => {
                say!(self, s, "t={} o{o}'s client re-reads", s.now);
                self.client_iteration(&mut s, o);
            }
            Action::Prepare(o) => {
                say!(self, s, "t={} o{o} (inst{}) swap request: prepare", s.now, self.instance_of(o));
                self.prepare(&mut s, o);
            }
            Action::Copy(o) => {
                let Some(SwapStage::Prepared { source, target, before, .. }) = s.orchs[o as usize].swap.clone() else {
                    unreachable!()
                };
                if s.data[target as usize] != before {
                    // `copy_resource_if` refuses: the handler decides again (a new prepare).
                    s.orchs[o as usize].swap = None;
                    s.orchs[o as usize].retry = Some(Step::Swap(target));
                    say!(
                        self,
                        s,
                        "t={} o{o}'s swap handler: the target changed since it looked; deciding again",
                        s.now
                    );
                    return Some(s);
                }
                s.data[target as usize] = s.data[source as usize];
                s.orchs[o as usize].swap = Some(SwapStage::Copied { target });
                say!(
                    self,
                    s,
                    "t={} o{o}'s swap handler copies {} -> {} ({:?})",
                    s.now,
                    LOCATIONS[source as usize],
                    LOCATIONS[target as usize],
                    s.data[target as usize]
                );
            }
            Action::Commit(n, ack) => self.commit(&mut s, n, ack),
            Action::Deliver(o) => {
                let Some((step, Client::Acked { next, etag, committed, sent, .. })) = s.orchs[o as usize].call.clone()
                else {
                    unreachable!()
                };
                say!(self, s, "t={} late acknowledgement reaches o{o}", s.now);
                self.judge(&mut s, o, step, &next, etag, committed, sent);
            }
            Action::Timeout(o) => {
                s.ambiguous_used += 1;
                let (step, client) = s.orchs[o as usize].call.clone().expect("a call in progress");
                let condition = match client {
                    Client::Waiting { condition, .. } => {
                        for w in s.inflight.iter_mut().filter(|w| w.from == o && !w.abandoned) {
                            w.abandoned = true;
                        }
                        condition
                    }
                    Client::Acked { condition, .. } => condition,
                    Client::Ready { .. } => unreachable!(),
                };
                s.orchs[o as usize].call = Some((step, Client::Ready { unresolved: Some(condition) }));
                say!(self, s, "t={} o{o}'s client times out on its {} write (outcome unknown)", s.now, step_name(step));
            }
            Action::Drop(n) => {
                let w = s.inflight.remove(n as usize);
                say!(self, s, "t={} store drops o{}'s abandoned write (never applied)", s.now, w.from);
            }
            Action::User(i, op, r) => self.user(&mut s, i, op, r),
            Action::ForceRequest => self.force_request(&mut s),
            Action::ForceApprove => self.force_approve(&mut s),
            Action::ForceCommit => self.force_commit(&mut s),
        }
        if self.users_done(&s) {
            // No user request can come any more: caches are unobservable, so states that
            // differ only in them are one state.
            for c in s.caches.iter_mut() {
                *c = None;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one orchestrator holds a live lock", |m: &LockModel, s: &State| {
                m.holders(s).len() <= 1
            }),
            Property::always("a holder's lock is in the document", |m: &LockModel, s: &State| m.holders_in_document(s)),
            Property::always("no write accepted under an effective write lock", |_: &LockModel, s: &State| {
                s.violations & violation::WRITE_UNDER_LOCK == 0
            }),
            Property::always("no physical delete accepted under an effective lock", |_: &LockModel, s: &State| {
                s.violations & violation::DELETE_UNDER_LOCK == 0
            }),
            Property::always(
                "the cutover is atomic (no write routed to a stale location)",
                |_: &LockModel, s: &State| s.violations & violation::STALE_ROUTE == 0,
            ),
            Property::always("no acknowledged write lost", |m: &LockModel, s: &State| !m.write_lost(s)),
            Property::always("no tombstone or deleted item resurrected", |m: &LockModel, s: &State| !m.resurrected(s)),
            Property::always("a keyed call takes effect at most once", |_: &LockModel, s: &State| {
                s.violations & violation::APPLIED_TWICE == 0
            }),
            Property::always("a force-released token acts no more", |_: &LockModel, s: &State| {
                s.violations & violation::FENCED_ACTED == 0
            }),
            Property::sometimes("a swap completes", |_: &LockModel, s: &State| s.swapped),
            Property::sometimes("a retry settles an ambiguous pre-lock", |_: &LockModel, s: &State| {
                s.ambiguous_prelock_settled
            }),
            Property::sometimes("the record cap refuses a call", |_: &LockModel, s: &State| s.records_full),
            Property::sometimes("a release takes effect", |m: &LockModel, s: &State| {
                s.applied & m.slot_mask(|_, slot| slot == 4) != 0
            }),
            Property::sometimes("a second migration takes a lock", |m: &LockModel, s: &State| {
                s.applied & m.slot_mask(|attempt, slot| attempt > 0 && slot == 0) != 0
            }),
            Property::sometimes("a swap completes with a clock behind", |_: &LockModel, s: &State| {
                s.swapped && s.skew.iter().any(|k| *k < 0)
            }),
            Property::sometimes("a force-release removes a lock its holder still uses", |_: &LockModel, s: &State| {
                s.force_released
            }),
        ]
    }
}

impl LockModel {
    /// Orchestrators that hold a live lock: acknowledged, live in true time, and not
    /// giving it up (a swap or release in progress hands it over).
    /// An orchestrator whose lock an approved force-release removed is not one: every
    /// call it makes is refused from then on ("a force-released token acts no more"
    /// checks that it gets nothing done).
    pub fn holders(&self, s: &State) -> Vec<u8> {
        let now = at(s.now as i16);
        let current = &self.current(s).settled.doc;
        let fenced = |h: &Held| {
            !current.force_releases.is_empty() && current.force_releases.iter().any(|r| r.fences(&h.token.digest()))
        };
        s.orchs
            .iter()
            .enumerate()
            .filter(|(_, o)| o.held.as_ref().is_some_and(|h| now < h.expires && !fenced(h)) && !o.handing_over)
            .map(|(i, _)| i as u8)
            .collect()
    }

    /// No user request that could violate a property can come any more (reads only
    /// fill caches for later writes and deletes).
    fn users_done(&self, s: &State) -> bool {
        s.requests >= self.bounds.requests || (s.writes >= self.bounds.writes && s.deletes >= self.bounds.deletes)
    }

    /// Every holder's token holds the document's lock, with at least the lease it was told.
    fn holders_in_document(&self, s: &State) -> bool {
        let current = self.current(s).settled.clone();
        self.holders(s).into_iter().all(|o| {
            let held = s.orchs[o as usize].held.as_ref().expect("a holder holds");
            current
                .doc
                .primary
                .lock
                .as_ref()
                .is_some_and(|l| l.token.matches(&held.token) && l.expires_at >= held.expires)
        })
    }

    fn authoritative_item(&self, s: &State) -> Option<Item> {
        s.data[location_index(&self.current(s).settled.doc.primary.location) as usize]
    }

    fn write_lost(&self, s: &State) -> bool {
        match s.ghost {
            Some(Item::Value(v)) => self.authoritative_item(s) != Some(Item::Value(v)),
            _ => false,
        }
    }

    fn resurrected(&self, s: &State) -> bool {
        match s.ghost {
            Some(Item::Tombstone) | None => matches!(self.authoritative_item(s), Some(Item::Value(_))),
            _ => false,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Traces

/// A document in one line: location, lock, secondary, pending.
pub fn describe_doc(d: &LocationDocument) -> String {
    let mut out = format!("location {}", d.primary.location);
    match &d.primary.lock {
        Some(l) => {
            let _ = write!(
                out,
                ", lock {} {} effective {} expires {}",
                l.token.expose(),
                l.phase,
                tick_of(l.effective_at),
                tick_of(l.expires_at)
            );
        }
        None => out.push_str(", no lock"),
    }
    if let Some(sec) = &d.secondary {
        if let Some(l) = &sec.lock {
            let _ = write!(out, ", guard on {} until {}", sec.location, tick_of(l.expires_at));
        }
    }
    if let Some(p) = &d.pending {
        if let Some(v) = p.void_if_committed_after {
            let _ = write!(out, " [void if committed after {}]", tick_of(v));
        }
        if let Some(e) = p.effective_after_commit_seconds {
            let _ = write!(out, " [effective >= commit + {e}s]");
        }
    }
    out
}

/// A counterexample (or example) path, one line per step, with what held at the end.
pub fn render_path(model: &LockModel, path: &stateright::Path<State, Action>) -> String {
    let mut narrator = LockModel::new(model.variant, model.bounds.clone());
    narrator.narrate = true;
    let steps = path.clone().into_vec();
    let mut states = vec![steps[0].0.clone()];
    for (_, action) in &steps {
        if let Some(action) = action {
            let next = narrator.next_state(states.last().expect("a state"), *action).expect("steps are deterministic");
            states.push(next);
        }
    }
    let mut out = String::new();
    let first = &states[0];
    let _ = writeln!(
        out,
        "  clocks: {}",
        first.skew.iter().enumerate().map(|(i, k)| format!("inst{i} {:+}", k)).collect::<Vec<_>>().join(", ")
    );
    for (n, s) in states.iter().enumerate().skip(1) {
        let _ = writeln!(out, "  {n:>2}. {}", s.note.0);
    }
    let last = states.last().expect("a path has a state");
    let _ = writeln!(out, "  end: t={}, document {:?}", last.now, model.current(last).settled);
    let _ = writeln!(
        out,
        "       items a={:?} b={:?}, users were told {:?}; holders {:?}",
        last.data[0],
        last.data[1],
        last.ghost,
        model.holders(last)
    );
    out
}

// ---------------------------------------------------------------------------------------
// Running the checker

/// What one exhaustive run found.
pub struct Outcome {
    /// States generated (with repeats).
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// Longest path explored.
    pub depth: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Violated `always` properties, each with its (shortest) counterexample.
    pub counterexamples: Vec<(&'static str, stateright::Path<State, Action>)>,
    /// `sometimes` properties that were shown reachable.
    pub examples: Vec<&'static str>,
}

/// Explores every state of `model` breadth first (shortest counterexamples), stopping
/// at the first violation when `stop_at_first` (for the broken variants).
pub fn check(model: LockModel, threads: usize, stop_at_first: bool, progress: bool) -> (LockModel, Outcome) {
    use stateright::{Checker, Expectation, HasDiscoveries};
    let started = std::time::Instant::now();
    let mut builder = model.checker().threads(threads);
    if stop_at_first {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker =
        if progress { builder.spawn_bfs().join_and_report(&mut Progress) } else { builder.spawn_bfs().join() };
    let elapsed = started.elapsed();
    let model = checker.model();
    let discoveries = checker.discoveries();
    let mut counterexamples = Vec::new();
    let mut examples = Vec::new();
    for p in model.properties() {
        match (p.expectation, discoveries.get(p.name)) {
            (Expectation::Always, Some(path)) => counterexamples.push((p.name, path.clone())),
            (Expectation::Sometimes, Some(_)) => examples.push(p.name),
            _ => {}
        }
    }
    let outcome = Outcome {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed,
        counterexamples,
        examples,
    };
    let model = LockModel::new(model.variant, model.bounds.clone());
    (model, outcome)
}

/// Prints the checker's progress to stderr every few seconds.
struct Progress;

impl stateright::report::Reporter<LockModel> for Progress {
    fn report_checking(&mut self, data: stateright::report::ReportData) {
        eprintln!(
            "  ... {} states, {} distinct, depth {}, {:.0?}{}",
            data.total_states,
            data.unique_states,
            data.max_depth,
            data.duration,
            if data.done { " (done)" } else { "" }
        );
    }

    fn report_discoveries(
        &mut self,
        _: &LockModel,
        _: std::collections::BTreeMap<&'static str, stateright::report::ReportDiscovery<LockModel>>,
    ) {
    }

    fn delay(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// Replays a counterexample's steps on the fixed protocol: the name of the property the
/// fixed protocol violates on the same schedule, if any (`Err` with the step that the
/// fixed protocol cannot take). Tells a broken variant's own counterexample from one
/// the shipped protocol shares.
pub fn replay_on_fixed(bounds: &Bounds, path: &stateright::Path<State, Action>) -> Result<Option<&'static str>, usize> {
    use stateright::Expectation;
    let fixed = LockModel::new(Variant::Fixed, bounds.clone());
    let always: Vec<_> = fixed.properties().into_iter().filter(|p| p.expectation == Expectation::Always).collect();
    let steps = path.clone().into_vec();
    let mut state = steps[0].0.clone();
    for (n, (_, action)) in steps.iter().enumerate() {
        let Some(action) = action else { break };
        let mut offered = Vec::new();
        fixed.actions(&state, &mut offered);
        if !offered.contains(action) {
            return Err(n + 1);
        }
        state = fixed.next_state(&state, *action).expect("steps are deterministic");
        if let Some(p) = always.iter().find(|p| !(p.condition)(&fixed, &state)) {
            return Ok(Some(p.name));
        }
    }
    Ok(None)
}
