//! The location document: one per resource, routing and lock state together.
//!
//! Fields this version does not know are kept in `extra` maps and written back
//! unchanged, so services on different library versions do not drop each other's
//! data during a rollout. `schemaVersion` names the document's *format*
//! (docs/contract.md, "Versions"): a change that a reader of the previous format could
//! misread takes a new format; an additive field that such a reader may ignore does
//! not. A document in a format this library does not read is refused, never guessed at.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The formats this library reads (1: contract 1.0's documents, and those contract
/// 1.1's builds wrote before format 2 existed; 2) and the newest it writes. A document
/// is written in the oldest format that says what it means ([`LocationDocument::format`]),
/// so a reader of format 1 keeps reading every document it cannot misread.
pub use crate::versions::{FORMATS_READ, NEWEST_FORMAT};

/// Format 1: the sections, their locks and the migrating flag; operation records and
/// additive lock fields (`convergenceDelaySeconds`, `phaseSince`) may be present and
/// ignored.
pub const FORMAT_1: u64 = 1;

/// Format 2: format 1 plus a `pending` effect, which changes what the sections mean
/// (a pre-lock effective only from its commit, a write void if committed after its
/// lease). A reader of format 1 would take such a write at face value: resurrect a
/// lapsed lease, follow a void swap, or start a pre-lock early.
pub const FORMAT_2: u64 = 2;

/// The id prefix of a lock record: the lock-record design (`--lock-design record`) keeps
/// each resource's lock in its own document, `lock:<resource id>`, beside the routing
/// document in the same store. A store counts calls per kind by it ([`DocKind::of`]).
pub const LOCK_RECORD_PREFIX: &str = "lock:";

/// The id of `resource`'s lock record in the lock-record design.
pub fn lock_record_id(resource: &str) -> String {
    format!("{LOCK_RECORD_PREFIX}{resource}")
}

/// What a stored document is for, told by its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DocKind {
    /// A resource's routing document (the embedded design's lock lives in it).
    Routing,
    /// A lock record of the lock-record design.
    Lock,
}

impl DocKind {
    /// Both kinds, in declaration order.
    pub const ALL: [DocKind; 2] = [DocKind::Routing, DocKind::Lock];

    /// The kind of the document with id `id`.
    pub fn of(id: &str) -> Self {
        if id.starts_with(LOCK_RECORD_PREFIX) {
            DocKind::Lock
        } else {
            DocKind::Routing
        }
    }

    /// The name used as a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            DocKind::Routing => "routing",
            DocKind::Lock => "lock",
        }
    }
}

/// Why a stored JSON value is not a usable location document.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DocumentError {
    /// Written in a format this library does not read (a newer library's).
    #[error(
        "location document {id:?} has schemaVersion {found}; this library reads formats {} to {}",
        FORMATS_READ.start(),
        FORMATS_READ.end()
    )]
    UnsupportedSchema {
        /// The document id, when it could be read.
        id: String,
        /// The version found in the document.
        found: u64,
    },
    /// Not a location document at all.
    #[error("malformed location document: {0}")]
    Malformed(String),
}

impl DocumentError {
    /// Every [`Self::reason`], for metrics labels that must exist before the first one.
    pub const REASONS: [&'static str; 2] = ["unsupported-format", "malformed"];

    /// A short, stable name for the kind of refusal: `unsupported-format` (a format
    /// this library does not read, usually a newer library's) or `malformed`.
    pub fn reason(&self) -> &'static str {
        match self {
            DocumentError::UnsupportedSchema { .. } => Self::REASONS[0],
            DocumentError::Malformed(_) => Self::REASONS[1],
        }
    }
}

/// The longest duration a stored document may hold, in seconds: a hundred years, far
/// beyond any lease or delay a writer stores (the contract caps each at ten years) and
/// far from where time arithmetic overflows.
pub const MAX_STORED_SECONDS: f64 = 3_155_760_000.0;

/// A stored duration in seconds: finite, not negative, at most [`MAX_STORED_SECONDS`].
fn stored_seconds(field: &str, seconds: f64) -> Result<(), String> {
    if seconds.is_finite() && (0.0..=MAX_STORED_SECONDS).contains(&seconds) {
        Ok(())
    } else {
        Err(format!("{field} is {seconds}, outside 0 to {MAX_STORED_SECONDS} seconds"))
    }
}

/// A stored instant: within years 1 to 9999, so that adding or subtracting any stored or
/// configured duration stays within what a timestamp can hold.
fn stored_instant(field: &str, at: DateTime<Utc>) -> Result<(), String> {
    use chrono::Datelike;
    if (1..=9999).contains(&at.year()) {
        Ok(())
    } else {
        Err(format!("{field} is {at}, outside years 1 to 9999"))
    }
}

/// The routing and lock state of one resource.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocationDocument {
    /// Resource id (also the partition key).
    pub id: String,
    /// The format the document was read in (see [`FORMATS_READ`]); written as
    /// [`Self::format`] by [`Self::to_json`], whatever it holds.
    pub schema_version: u64,
    /// The active location and its lock, if any.
    pub primary: Section,
    /// During a migration: the target location; after a swap: the old one, locked until
    /// caches have converged on the new location.
    pub secondary: Option<Section>,
    /// True from pre-lock until swap or release.
    pub migrating: bool,
    /// The effect of the last write that depends on when the store committed it (a
    /// pre-lock's start, a lease-bound call's validity). Readers settle it with the
    /// version's commit time; the next write stores the settled state. Shared, not
    /// copied, when the document is cloned: it can hold a whole earlier document, and
    /// every read of a version would copy it only for settling to drop it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Arc<PendingEffect>>,
    /// Recent lock calls (bounded), so a repeated call returns the first one's outcome
    /// and a writer recognises its own committed write. Shared, not copied, when the
    /// document is cloned: every read of a version copies it, and only a write changes
    /// the records (`Arc::make_mut`).
    #[serde(default, skip_serializing_if = "no_records")]
    pub operations: Arc<Vec<OperationRecord>>,
    /// Requests to force-release a stuck lock, their approvals and what they did: the
    /// audit trail of an operator's removal of someone else's lock (bounded; the open
    /// requests and the newest closed ones). Additive: a reader that does not know it
    /// keeps it in `extra` and writes it back, and the lock it removed is gone for every
    /// reader alike. Shared, not copied, when the document is cloned, like `operations`.
    #[serde(default, skip_serializing_if = "no_force_releases")]
    pub force_releases: Arc<Vec<ForceRelease>>,
    /// Fields written by other versions (and store metadata), preserved on rewrite.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn no_records(operations: &Arc<Vec<OperationRecord>>) -> bool {
    operations.is_empty()
}

fn no_force_releases(records: &Arc<Vec<ForceRelease>>) -> bool {
    records.is_empty()
}

/// One request to force-release a lock, from its request to its end.
///
/// Two people take part: one requests, naming the lock by its token's digest (never the
/// token) and its phase, with a reason; another approves within the window. Only then is
/// the lock removed, by one ETag-conditional write. The record stays after that, so the
/// old holder's token is refused by name ([`ForceRelease::fences`]) and the change stream
/// shows who removed which lock and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForceRelease {
    /// The request's id (hex), unique within the document.
    pub id: String,
    /// Digest of the targeted lock's token ([`LockToken::digest`]).
    pub lock: String,
    /// The phase the lock was in when the release was requested: a later phase voids it.
    pub phase: Phase,
    /// The targeted lock's owner, for the audit.
    pub owner: String,
    /// Who asked.
    pub requested_by: String,
    /// Why.
    pub reason: String,
    /// When it was asked (the deciding clock).
    #[serde(serialize_with = "json_time::serialize")]
    pub requested_at: DateTime<Utc>,
    /// The last instant an approval is accepted.
    #[serde(serialize_with = "json_time::serialize")]
    pub approve_by: DateTime<Utc>,
    /// Who approved it (never the requester), once someone did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// When it was approved.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "json_time::serialize_option")]
    pub approved_at: Option<DateTime<Utc>>,
    /// What it came to.
    pub outcome: ForceOutcome,
    /// Fields written by other versions, preserved while the record is kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Where a [`ForceRelease`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ForceOutcome {
    /// Waiting for a second person (until `approveBy`; expired after it).
    Requested,
    /// Approved, and the lock was removed by the approval's write.
    Released,
    /// Approved after the lock had changed (another token, a later phase, or no lock):
    /// nothing was removed.
    Void,
}

impl ForceOutcome {
    /// The name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ForceOutcome::Requested => "requested",
            ForceOutcome::Released => "released",
            ForceOutcome::Void => "void",
        }
    }
}

impl ForceRelease {
    /// Whether this record removed the lock whose token has digest `lock`: that token
    /// is refused from then on.
    pub fn fences(&self, lock: &str) -> bool {
        self.outcome == ForceOutcome::Released && self.lock == lock
    }

    /// Whether it still waits for an approval at `now`.
    pub fn is_open(&self, now: DateTime<Utc>) -> bool {
        self.outcome == ForceOutcome::Requested && now <= self.approve_by
    }
}

/// What the last write means depends on when the store committed it.
///
/// A write is decided on one clock and committed later on the store's; some rules can
/// only be judged by the commit time, which every reader gets with the version:
/// a pre-lock restricts nothing before its commit + the declared delay (+ skew margin),
/// and a call that relied on a live lease is void when it landed after that lease.
///
/// The record belongs to the version that wrote it, so every writer must settle the
/// document it read before writing it back (the routing library always does). A
/// writer that does not know this field (an earlier library version) changes the lock
/// state it rewrites, which the digest detects; a writer outside the library that
/// rewrote the document unchanged would make the record be judged by its own commit
/// time, which is why the routing library must stay the only writer of lock state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingEffect {
    /// A pre-lock: its `effectiveAt` (and the leases counted from it) are no earlier
    /// than the commit + this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_after_commit_seconds: Option<f64>,
    /// The write relied on a lease ending here: committed then or later, it takes no
    /// effect and readers see `previous`.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "json_time::serialize_option")]
    pub void_if_committed_after: Option<DateTime<Utc>>,
    /// The document this write replaced (settled), restored when the write is void.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Arc<LocationDocument>>,
    /// The write began the lock's current phase: the commit time becomes `phaseSince`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub phase_starts: bool,
    /// The key of the call that made this write: a void write's record is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Digest of the routing and lock state this write produced. A writer that does not
    /// know this field keeps it unchanged while changing that state; the digest then no
    /// longer matches and the stale record is ignored instead of misapplied.
    pub digest: String,
}

/// The lock calls, as recorded for replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CallKind {
    /// `POST /lock`.
    PreLock,
    /// `POST /lock/escalate`.
    Escalate,
    /// `POST /lock/renew`.
    Renew,
    /// `POST /lock/swap`.
    Swap,
    /// `DELETE /lock`.
    Release,
}

impl CallKind {
    /// The name used on the wire and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::PreLock => "preLock",
            CallKind::Escalate => "escalate",
            CallKind::Renew => "renew",
            CallKind::Swap => "swap",
            CallKind::Release => "release",
        }
    }
}

/// One lock call that took effect, kept so that a repeat is recognised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationRecord {
    /// `k:<Idempotency-Key>` from a caller, or `w:<random>` for a call without one (the
    /// library's own retries recognise their write by it). The record's texts are
    /// shared between the document's versions: every write copies the records it keeps.
    pub key: Arc<str>,
    /// Which call it was.
    pub call: CallKind,
    /// Digest of the request (call, body, token): a key reused for another request is
    /// refused.
    pub request: Arc<str>,
    /// Digest of the token of the lock the call created or acted on (never the token).
    pub lock: Arc<str>,
    /// Kept at least until then (the lock's ceiling, so it outlives every lease).
    #[serde(serialize_with = "json_time::serialize")]
    pub keep_until: DateTime<Utc>,
    /// Fields written by other versions, preserved while the record is kept.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A location and the lock on it.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Section {
    /// Region name, e.g. `westeurope`.
    pub location: String,
    /// The migration lock, if one was ever taken and not cleared (it may have expired).
    pub lock: Option<LockInfo>,
    /// Fields written by other versions, preserved on rewrite.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A migration lock as stored in the document.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockInfo {
    /// The fencing token every later operation must present.
    pub token: LockToken,
    /// Current phase.
    pub phase: Phase,
    /// Free text naming the orchestrator, for operators.
    pub owner: String,
    /// When the pre-lock was granted.
    #[serde(serialize_with = "json_time::serialize")]
    pub acquired_at: DateTime<Utc>,
    /// acquiredAt + convergence delay: no user operation is restricted before it.
    #[serde(serialize_with = "json_time::serialize")]
    pub effective_at: DateTime<Utc>,
    /// This phase's lease.
    #[serde(serialize_with = "json_time::serialize")]
    pub expires_at: DateTime<Utc>,
    /// The parent lease: no phase outlives it.
    #[serde(serialize_with = "json_time::serialize")]
    pub pre_lock_expires_at: DateTime<Utc>,
    /// Ceiling renewals can never pass.
    #[serde(serialize_with = "json_time::serialize")]
    pub max_expires_at: DateTime<Utc>,
    /// How many times the lease was renewed.
    pub renewals: u32,
    /// The convergence delay declared when the lock was granted (absent in documents
    /// of earlier versions, where it is `effectiveAt - acquiredAt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub convergence_delay_seconds: Option<f64>,
    /// When the store committed the write that began the current phase (absent until
    /// known, and in documents of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "json_time::serialize_option")]
    pub phase_since: Option<DateTime<Utc>>,
    /// Fields written by other versions, preserved on rewrite.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A copy of `extra`, which is empty in nearly every document: cloning even an empty
/// map walks its table, and a clone of a document has five of them (a lock call makes
/// several clones). Every other field is cloned as `derive(Clone)` would; the impls
/// below destructure the structs, so a new field cannot be left out.
fn clone_extra(extra: &Map<String, Value>) -> Map<String, Value> {
    if extra.is_empty() {
        Map::new()
    } else {
        extra.clone()
    }
}

impl Clone for LocationDocument {
    fn clone(&self) -> Self {
        let Self { id, schema_version, primary, secondary, migrating, pending, operations, force_releases, extra } =
            self;
        Self {
            id: id.clone(),
            schema_version: *schema_version,
            primary: primary.clone(),
            secondary: secondary.clone(),
            migrating: *migrating,
            pending: pending.clone(),
            operations: operations.clone(),
            force_releases: force_releases.clone(),
            extra: clone_extra(extra),
        }
    }
}

impl Clone for Section {
    fn clone(&self) -> Self {
        let Self { location, lock, extra } = self;
        Self { location: location.clone(), lock: lock.clone(), extra: clone_extra(extra) }
    }
}

impl Clone for LockInfo {
    fn clone(&self) -> Self {
        let Self {
            token,
            phase,
            owner,
            acquired_at,
            effective_at,
            expires_at,
            pre_lock_expires_at,
            max_expires_at,
            renewals,
            convergence_delay_seconds,
            phase_since,
            extra,
        } = self;
        Self {
            token: token.clone(),
            phase: *phase,
            owner: owner.clone(),
            acquired_at: *acquired_at,
            effective_at: *effective_at,
            expires_at: *expires_at,
            pre_lock_expires_at: *pre_lock_expires_at,
            max_expires_at: *max_expires_at,
            renewals: *renewals,
            convergence_delay_seconds: *convergence_delay_seconds,
            phase_since: *phase_since,
            extra: clone_extra(extra),
        }
    }
}

/// [`LocationDocument::lock_state`] of a version without a lock.
pub const UNLOCKED: &str = "unlocked";

/// Every [`LocationDocument::lock_state`], in a migration's order: the label values of
/// the document-size metrics, pre-registered so every series exists at 0.
pub const LOCK_STATES: [&str; 4] = ["preLock", "hardDelete", "write", UNLOCKED];

/// The lock phases, in escalation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Migration intent recorded; caches converge; no user restriction.
    PreLock,
    /// Deletes become tombstones while history is copied.
    HardDelete,
    /// Writes and deletes are refused while the last delta is copied.
    Write,
}

impl Phase {
    /// The name used on the wire and in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::PreLock => "preLock",
            Phase::HardDelete => "hardDelete",
            Phase::Write => "write",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "preLock" => Ok(Phase::PreLock),
            "hardDelete" => Ok(Phase::HardDelete),
            "write" => Ok(Phase::Write),
            other => Err(format!("unknown phase {other:?}; expected preLock, hardDelete or write")),
        }
    }
}

/// A 128-bit random lock token, hex encoded. Its `Debug` form is redacted so it
/// cannot leak into logs by accident.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LockToken(String);

impl LockToken {
    /// A fresh token from the operating system's random source.
    pub fn generate() -> Self {
        let bytes: [u8; 16] = rand::random();
        Self(to_hex(&bytes))
    }

    /// Wraps a token presented by a caller.
    pub fn from_presented(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself, to hand to the lock's owner and nobody else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares in constant time, so response timing does not reveal a token prefix.
    pub fn matches(&self, other: &LockToken) -> bool {
        let (a, b) = (self.0.as_bytes(), other.0.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// A one-way digest that identifies the token in records without revealing it.
    pub fn digest(&self) -> String {
        digest_hex(&[b"lockprobe-token:", self.0.as_bytes()])
    }
}

/// SHA-256 over `parts`, hex, truncated to 128 bits (enough to tell values apart; the
/// inputs that matter, tokens, are 128-bit random already).
pub fn digest_hex(parts: &[&[u8]]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    to_hex(&hasher.finalize()[..16])
}

/// `bytes` as lowercase hex, written in one go: `hex::encode` collects a `String` one
/// `char` at a time, at about four times the cost (30 against 140 ns for 16 bytes), and
/// every lock call makes several digests.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut text = vec![0; bytes.len() * 2];
    hex::encode_to_slice(bytes, &mut text).expect("the buffer holds two digits per byte");
    String::from_utf8(text).expect("hex digits are ASCII")
}

/// A section without its `extra` map, as `serde_json` writes it.
fn write_bare_section(out: &mut Vec<u8>, section: &Section) {
    out.extend_from_slice(b"{\"location\":");
    write_json_str(out, &section.location);
    out.extend_from_slice(b",\"lock\":");
    let Some(lock) = &section.lock else {
        out.extend_from_slice(b"null}");
        return;
    };
    out.extend_from_slice(b"{\"token\":");
    write_json_str(out, lock.token.expose());
    out.extend_from_slice(b",\"phase\":\"");
    out.extend_from_slice(lock.phase.as_str().as_bytes());
    out.extend_from_slice(b"\",\"owner\":");
    write_json_str(out, &lock.owner);
    let times = [
        (&b",\"acquiredAt\":"[..], lock.acquired_at),
        (b",\"effectiveAt\":", lock.effective_at),
        (b",\"expiresAt\":", lock.expires_at),
        (b",\"preLockExpiresAt\":", lock.pre_lock_expires_at),
        (b",\"maxExpiresAt\":", lock.max_expires_at),
    ];
    for (name, at) in times {
        out.extend_from_slice(name);
        write_json_time(out, at);
    }
    out.extend_from_slice(b",\"renewals\":");
    serde_json::to_writer(&mut *out, &lock.renewals).expect("writing to a Vec cannot fail");
    if let Some(seconds) = lock.convergence_delay_seconds {
        out.extend_from_slice(b",\"convergenceDelaySeconds\":");
        serde_json::to_writer(&mut *out, &seconds).expect("writing to a Vec cannot fail");
    }
    if let Some(since) = lock.phase_since {
        out.extend_from_slice(b",\"phaseSince\":");
        write_json_time(out, since);
    }
    out.extend_from_slice(b"}}");
}

fn write_json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

/// A time as chrono's `Serialize` writes it (RFC 3339, `Z`, 0, 3, 6 or 9 fractional
/// digits), quoted. Years outside 0..=9999 (never a lock's) take chrono's own path.
fn write_json_time(out: &mut Vec<u8>, at: DateTime<Utc>) {
    match JsonTime::of(at) {
        Some(text) => {
            out.push(b'"');
            out.extend_from_slice(text.as_bytes());
            out.push(b'"');
        }
        None => serde_json::to_writer(&mut *out, &at).expect("writing to a Vec cannot fail"),
    }
}

/// A time's text as chrono's `Serialize` writes it, unquoted, on the stack: at most
/// `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
struct JsonTime {
    bytes: [u8; 30],
    len: usize,
}

impl JsonTime {
    /// The text of `at`; `None` for years outside 0..=9999 (never a lock's), which
    /// chrono writes its own way.
    fn of(at: DateTime<Utc>) -> Option<Self> {
        use chrono::{Datelike, Timelike};
        // Once: every accessor of a `DateTime` converts it to local (here UTC) time anew.
        let at = at.naive_utc();
        let year = at.year();
        if !(0..=9999).contains(&year) {
            return None;
        }
        let mut text = Self { bytes: [0; 30], len: 0 };
        // A leap second's nanoseconds run past 1e9; chrono writes it as second 60.
        let (mut second, mut nano) = (at.second(), at.nanosecond());
        if nano >= 1_000_000_000 {
            second += 1;
            nano -= 1_000_000_000;
        }
        let fields = [
            (year as u32 / 100, b'\0'),
            (year as u32 % 100, b'-'),
            (at.month(), b'-'),
            (at.day(), b'T'),
            (at.hour(), b':'),
            (at.minute(), b':'),
            (second, b'\0'),
        ];
        for (n, after) in fields {
            text.push(b'0' + (n / 10) as u8);
            text.push(b'0' + (n % 10) as u8);
            if after != b'\0' {
                text.push(after);
            }
        }
        let (digits, mut value) = match nano {
            0 => (0, 0),
            n if n % 1_000_000 == 0 => (3, n / 1_000_000),
            n if n % 1_000 == 0 => (6, n / 1_000),
            n => (9, n),
        };
        if digits > 0 {
            text.push(b'.');
            let start = text.len;
            text.len += digits;
            for slot in text.bytes[start..text.len].iter_mut().rev() {
                *slot = b'0' + (value % 10) as u8;
                value /= 10;
            }
        }
        text.push(b'Z');
        Some(text)
    }

    fn push(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    fn as_str(&self) -> &str {
        // Only ASCII digits and separators were pushed.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

/// The stored form of a time, as chrono's `Serialize` writes it but in one string
/// rather than character by character through `Display` (which cost most of counting a
/// document's size, [`LocationDocument::serialized_len`]). Reading is chrono's.
mod json_time {
    use chrono::{DateTime, Utc};
    use serde::{Serialize, Serializer};

    use super::JsonTime;

    pub(super) fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        match JsonTime::of(*at) {
            Some(text) => s.serialize_str(text.as_str()),
            None => at.serialize(s),
        }
    }

    pub(super) fn serialize_option<S: Serializer>(at: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        struct Time(DateTime<Utc>);
        impl Serialize for Time {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                serialize(&self.0, s)
            }
        }
        match at {
            Some(at) => s.serialize_some(&Time(*at)),
            None => s.serialize_none(),
        }
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LockToken(<redacted>)")
    }
}

impl LockInfo {
    /// The lease has not lapsed.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        now < self.expires_at
    }

    /// Live and past its effective time (within `skew` of it): user operations may be
    /// restricted, so caches must not serve it.
    pub fn is_started(&self, now: DateTime<Utc>, skew: chrono::TimeDelta) -> bool {
        self.is_live(now) && self.effective_at <= now + skew
    }

    /// The convergence delay declared when the lock was taken.
    pub fn convergence_delay(&self) -> chrono::TimeDelta {
        self.convergence_delay_seconds
            .and_then(|s| chrono::TimeDelta::try_milliseconds((s * 1000.0).round() as i64))
            .unwrap_or(self.effective_at - self.acquired_at)
    }
}

impl LocationDocument {
    /// A new, unlocked document at `location`.
    pub fn new(id: impl Into<String>, location: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            schema_version: FORMAT_1,
            primary: Section { location: location.into(), lock: None, extra: Map::new() },
            secondary: None,
            migrating: false,
            pending: None,
            operations: Arc::default(),
            force_releases: Arc::default(),
            extra: Map::new(),
        }
    }

    /// Digest of the routing and lock state as a library that does not know
    /// [`PendingEffect`] would see and change it: the sections and the migrating flag,
    /// without fields other versions added (their serialization is not ours to fix).
    ///
    /// The bytes hashed are the JSON of `(primary, secondary, migrating)` exactly as
    /// `serde_json` writes those sections without their `extra` maps: digests already
    /// stored in documents (and those of other library versions reading this one's)
    /// stay comparable. They are written here directly, into a reused buffer, because
    /// the serde path (cloning the sections, then formatting every timestamp through
    /// `collect_str`, escaped character by character) was a quarter of a replayed
    /// lock call's time; a test checks byte equality with the serde form.
    pub fn state_digest(&self) -> String {
        thread_local! {
            static STATE_JSON: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        STATE_JSON.with_borrow_mut(|buf| {
            buf.clear();
            self.write_state_json(buf);
            digest_hex(&[b"lockprobe-state:", buf])
        })
    }

    /// Appends the JSON [`Self::state_digest`] hashes to `out`.
    fn write_state_json(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        write_bare_section(out, &self.primary);
        out.push(b',');
        match &self.secondary {
            Some(section) => write_bare_section(out, section),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(if self.migrating { b",true]" } else { b",false]" });
    }

    /// Parses a stored document, refusing unsupported major versions.
    pub fn from_json(value: Value) -> Result<Self, DocumentError> {
        let id = value.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
        let found = value
            .get("schemaVersion")
            .ok_or_else(|| DocumentError::Malformed(format!("document {id:?} has no schemaVersion")))?
            .as_u64()
            .ok_or_else(|| {
                DocumentError::Malformed(format!("document {id:?}: schemaVersion is not a positive integer"))
            })?;
        if !FORMATS_READ.contains(&found) {
            return Err(DocumentError::UnsupportedSchema { id, found });
        }
        let doc: Self =
            serde_json::from_value(value).map_err(|e| DocumentError::Malformed(format!("document {id:?}: {e}")))?;
        doc.check_stored_values().map_err(|e| DocumentError::Malformed(format!("document {id:?}: {e}")))?;
        Ok(doc)
    }

    /// Stored values are input like any other: a duration or an instant far outside what
    /// any writer stores (`convergenceDelaySeconds: 1e308`, a year past 9999) would
    /// overflow the time arithmetic of every reader, so it is refused at decode, naming
    /// the field, like a field of the wrong type.
    fn check_stored_values(&self) -> Result<(), String> {
        for (name, section) in [("primary", Some(&self.primary)), ("secondary", self.secondary.as_ref())] {
            let Some(lock) = section.and_then(|s| s.lock.as_ref()) else { continue };
            let at = |field: &str, t: DateTime<Utc>| stored_instant(&format!("{name}.lock.{field}"), t);
            at("acquiredAt", lock.acquired_at)?;
            at("effectiveAt", lock.effective_at)?;
            at("expiresAt", lock.expires_at)?;
            at("preLockExpiresAt", lock.pre_lock_expires_at)?;
            at("maxExpiresAt", lock.max_expires_at)?;
            if let Some(since) = lock.phase_since {
                at("phaseSince", since)?;
            }
            if let Some(delay) = lock.convergence_delay_seconds {
                stored_seconds(&format!("{name}.lock.convergenceDelaySeconds"), delay)?;
            }
        }
        if let Some(pending) = &self.pending {
            if let Some(seconds) = pending.effective_after_commit_seconds {
                stored_seconds("pending.effectiveAfterCommitSeconds", seconds)?;
            }
            if let Some(after) = pending.void_if_committed_after {
                stored_instant("pending.voidIfCommittedAfter", after)?;
            }
            if let Some(previous) = &pending.previous {
                previous.check_stored_values().map_err(|e| format!("pending.previous: {e}"))?;
            }
        }
        for (i, record) in self.operations.iter().enumerate() {
            stored_instant(&format!("operations[{i}].keepUntil"), record.keep_until)?;
        }
        for (i, record) in self.force_releases.iter().enumerate() {
            stored_instant(&format!("forceReleases[{i}].requestedAt"), record.requested_at)?;
            stored_instant(&format!("forceReleases[{i}].approveBy"), record.approve_by)?;
            if let Some(at) = record.approved_at {
                stored_instant(&format!("forceReleases[{i}].approvedAt"), at)?;
            }
        }
        Ok(())
    }

    /// The format this document must be written in: [`FORMAT_2`] while it carries a
    /// pending effect, [`FORMAT_1`] otherwise.
    pub fn format(&self) -> u64 {
        if self.pending.is_some() {
            FORMAT_2
        } else {
            FORMAT_1
        }
    }

    /// The size in bytes of [`Self::to_json`] serialized, counted as it is written rather
    /// than built: the monitor measures every version it reads, so this is on its hot
    /// path.
    pub fn serialized_len(&self) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0 += bytes.len();
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        // Counted, not formatted: a formatted number would be an allocation per call.
        let digits = |n: u64| n.checked_ilog10().map_or(1, |d| d as usize + 1);
        let mut count = Count(0);
        // As `to_json`: a location document always serializes.
        serde_json::to_writer(&mut count, self).expect("a location document always serializes");
        // `to_json` writes the format in place of the `schemaVersion` the document was read with.
        count.0 + digits(self.format()) - digits(self.schema_version)
    }

    /// The JSON form written to the store, unknown fields included, its
    /// `schemaVersion` the [`Self::format`] of what it holds.
    pub fn to_json(&self) -> Value {
        let mut json = serde_json::to_value(self).expect("a location document always serializes");
        json["schemaVersion"] = Value::from(self.format());
        json
    }

    /// The lock state of this version as size metrics label it: the primary lock's
    /// phase, or `unlocked` (one of [`LOCK_STATES`]). The lease is not judged: a
    /// version is labelled by what it stores.
    pub fn lock_state(&self) -> &'static str {
        self.primary.lock.as_ref().map_or(UNLOCKED, |l| l.phase.as_str())
    }

    /// The primary lock if its lease has not lapsed.
    pub fn live_lock(&self, now: DateTime<Utc>) -> Option<&LockInfo> {
        self.primary.lock.as_ref().filter(|l| l.is_live(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The counted size is the size of what `to_json` writes, whatever `schemaVersion`
    /// the document was read with and whatever it carries.
    #[test]
    fn the_serialized_len_is_the_written_jsons() {
        let stored = json!({
            "id": "probe-1", "schemaVersion": 1, "migrating": false, "secondary": null,
            "primary": {"location": "westeurope", "lock": null, "tier": "gold"},
            "addedByV1_3": {"nested": [1, 2.5, "\u{e9}\"quoted\""]}
        });
        let mut doc = LocationDocument::from_json(stored).unwrap();
        let written = |d: &LocationDocument| serde_json::to_vec(&d.to_json()).unwrap().len();
        assert_eq!(doc.serialized_len(), written(&doc));
        // Read under another version than it is written in, of every width the digit
        // count meets.
        for version in [0, 9, 10, 12, 99, 100, 1000, u64::MAX] {
            doc.schema_version = version;
            assert_eq!(doc.serialized_len(), written(&doc), "read as version {version}");
        }
    }

    #[test]
    fn unknown_fields_survive_a_rewrite() {
        let stored = json!({
            "id": "probe-1", "schemaVersion": 1, "migrating": false, "secondary": null,
            "primary": {"location": "westeurope", "lock": null, "tier": "gold"},
            "addedByV1_3": {"nested": [1, 2]},
            "_etag": "abc"
        });
        let mut doc = LocationDocument::from_json(stored).unwrap();
        doc.primary.location = "northeurope".into();
        let written = doc.to_json();
        assert_eq!(written["addedByV1_3"], json!({"nested": [1, 2]}));
        assert_eq!(written["primary"]["tier"], json!("gold"));
        assert_eq!(written["primary"]["location"], json!("northeurope"));
    }

    #[test]
    fn a_clone_keeps_unknown_fields_at_every_level() {
        let lock = json!({
            "token": "t", "phase": "preLock", "owner": "o", "acquiredAt": "2026-01-01T00:00:00Z",
            "effectiveAt": "2026-01-01T00:01:00Z", "expiresAt": "2026-01-01T01:00:00Z",
            "preLockExpiresAt": "2026-01-01T01:00:00Z", "maxExpiresAt": "2026-01-01T02:00:00Z",
            "renewals": 0, "lockedBy": "v1.3"
        });
        let stored = json!({
            "id": "r", "schemaVersion": 1, "migrating": true,
            "primary": {"location": "westeurope", "lock": lock, "tier": "gold"},
            "secondary": {"location": "northeurope", "lock": null, "zone": 2},
            "addedByV1_3": {"nested": [1, 2]}
        });
        let doc = LocationDocument::from_json(stored.clone()).unwrap();
        let copy = doc.clone();
        assert_eq!(copy, doc);
        assert_eq!(copy.to_json(), doc.to_json());
        assert_eq!(copy.primary.lock.as_ref().unwrap().extra["lockedBy"], json!("v1.3"));
        assert_eq!(copy.secondary.as_ref().unwrap().extra["zone"], json!(2));
        let plain = LocationDocument::new("r", "westeurope");
        assert_eq!(plain.clone(), plain);
    }

    #[test]
    fn a_format_newer_than_this_library_reads_is_refused() {
        let stored = json!({"id": "r", "schemaVersion": 3, "primary": {"location": "x"}, "migrating": false});
        assert_eq!(
            LocationDocument::from_json(stored),
            Err(DocumentError::UnsupportedSchema { id: "r".into(), found: 3 })
        );
        let zero = json!({"id": "r", "schemaVersion": 0, "primary": {"location": "x"}, "migrating": false});
        assert_eq!(
            LocationDocument::from_json(zero),
            Err(DocumentError::UnsupportedSchema { id: "r".into(), found: 0 })
        );
    }

    #[test]
    fn a_document_is_written_in_the_oldest_format_that_says_what_it_means() {
        let mut doc = LocationDocument::new("r", "westeurope");
        assert_eq!(doc.to_json()["schemaVersion"], json!(1));
        doc.pending = Some(Arc::new(PendingEffect {
            effective_after_commit_seconds: Some(7.5),
            void_if_committed_after: None,
            previous: None,
            phase_starts: true,
            key: None,
            digest: doc.state_digest(),
        }));
        assert_eq!(doc.to_json()["schemaVersion"], json!(2));
        // What contract 1.1's builds wrote before format 2: a pending effect under
        // schemaVersion 1. Read as what it is, and written back as format 2.
        let mut unmarked = doc.to_json();
        unmarked["schemaVersion"] = json!(1);
        let read = LocationDocument::from_json(unmarked).unwrap();
        assert!(read.pending.is_some());
        assert_eq!(read.to_json()["schemaVersion"], json!(2));
        // Settled, it reads as format 1 again.
        let mut settled = read;
        settled.pending = None;
        let written = settled.to_json();
        assert_eq!(written["schemaVersion"], json!(1));
        assert_eq!(written.as_object().unwrap().keys().position(|k| k == "schemaVersion"), Some(1));
    }

    #[test]
    fn missing_or_bad_schema_version_is_malformed() {
        let missing =
            json!({"id": "r", "primary": {"location": "x", "lock": null}, "secondary": null, "migrating": false});
        assert!(matches!(LocationDocument::from_json(missing), Err(DocumentError::Malformed(_))));
        let text = json!({"id": "r", "schemaVersion": "1", "primary": {"location": "x"}});
        assert!(matches!(LocationDocument::from_json(text), Err(DocumentError::Malformed(_))));
    }

    #[test]
    fn round_trip_and_wire_names() {
        let doc = LocationDocument::new("probe-1", "westeurope");
        let json = doc.to_json();
        assert_eq!(json["schemaVersion"], json!(1));
        assert_eq!(json["primary"]["lock"], Value::Null);
        assert_eq!(LocationDocument::from_json(json).unwrap(), doc);
    }

    /// The JSON the state digest hashed before it was written by hand (the serde
    /// path, kept as the oracle): stored digests must keep matching.
    fn serde_state_json(doc: &LocationDocument) -> Vec<u8> {
        fn bare(section: &Section) -> Section {
            Section {
                location: section.location.clone(),
                lock: section.lock.as_ref().map(|l| LockInfo { extra: Map::new(), ..l.clone() }),
                extra: Map::new(),
            }
        }
        let state = (bare(&doc.primary), doc.secondary.as_ref().map(bare), doc.migrating);
        serde_json::to_vec(&state).unwrap()
    }

    fn state_json(doc: &LocationDocument) -> String {
        let mut out = Vec::new();
        doc.write_state_json(&mut out);
        String::from_utf8(out).unwrap()
    }

    fn time(secs: i64, nanos: u32) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, nanos).unwrap()
    }

    fn locked_section(location: &str, owner: &str, at: DateTime<Utc>) -> Section {
        Section {
            location: location.into(),
            lock: Some(LockInfo {
                token: LockToken::from_presented("00112233445566778899aabbccddeeff"),
                phase: Phase::HardDelete,
                owner: owner.into(),
                acquired_at: at,
                effective_at: at + chrono::TimeDelta::milliseconds(70_500),
                expires_at: at + chrono::TimeDelta::microseconds(600_000_001),
                pre_lock_expires_at: at + chrono::TimeDelta::nanoseconds(3_600_000_000_007),
                max_expires_at: at + chrono::TimeDelta::seconds(7200),
                renewals: 3,
                convergence_delay_seconds: Some(60.5),
                phase_since: Some(at + chrono::TimeDelta::seconds(81)),
                extra: [("addedLater".to_owned(), json!(1))].into_iter().collect(),
            }),
            extra: [("tier".to_owned(), json!("gold"))].into_iter().collect(),
        }
    }

    #[test]
    fn the_state_digest_hashes_the_same_bytes_as_the_serde_form() {
        let mut doc = LocationDocument::new("r", "westeurope");
        assert_eq!(state_json(&doc).as_bytes(), serde_state_json(&doc));
        doc.primary = locked_section("west\"europe\\\u{1}é", "replay", time(1_764_547_200, 0));
        doc.secondary = Some(locked_section("northeurope", "", time(59, 1_500_000_000)));
        doc.migrating = true;
        assert_eq!(state_json(&doc).as_bytes(), serde_state_json(&doc), "{}", state_json(&doc));
        // A digest a previous version stored for this state (the serde form) still matches.
        assert_eq!(doc.state_digest(), digest_hex(&[b"lockprobe-state:", &serde_state_json(&doc)]));
        let lock = doc.primary.lock.as_mut().unwrap();
        (lock.convergence_delay_seconds, lock.phase_since) = (None, None);
        lock.acquired_at = DateTime::from_timestamp(-62_198_755_200, 0).unwrap(); // year -1
        lock.max_expires_at = DateTime::<Utc>::MAX_UTC;
        assert_eq!(state_json(&doc).as_bytes(), serde_state_json(&doc), "{}", state_json(&doc));
    }

    mod any_state {
        use super::*;
        use proptest::prelude::*;

        /// A time through the fields' serializer.
        #[derive(serde::Serialize)]
        struct LockInfoTimes(#[serde(serialize_with = "json_time::serialize")] DateTime<Utc>);

        #[derive(serde::Serialize)]
        struct OptionalTime(#[serde(serialize_with = "json_time::serialize_option")] Option<DateTime<Utc>>);

        fn nanos() -> impl Strategy<Value = u32> {
            prop_oneof![
                Just(0u32),
                (0u32..1000).prop_map(|n| n * 1_000_000),
                (0u32..1_000_000).prop_map(|n| n * 1_000),
                0u32..2_000_000_000
            ]
        }

        proptest! {
            /// The stored form of a time is chrono's own, byte for byte (leap seconds and
            /// years outside 0..=9999 included), so documents read and written by earlier
            /// versions are unchanged.
            #[test]
            fn a_time_is_written_as_chrono_writes_it(
                secs in prop_oneof![-62_000_000_000i64..250_000_000_000, -70_000_000_000i64..-62_000_000_000],
                nanos in nanos(),
            ) {
                let at = DateTime::from_timestamp(secs, nanos)
                    .or_else(|| DateTime::from_timestamp(secs, nanos % 1_000_000_000))
                    .unwrap();
                let chrono = serde_json::to_string(&at).unwrap();
                let ours = serde_json::to_string(&LockInfoTimes(at)).unwrap();
                prop_assert_eq!(&ours, &chrono);
                let mut digest_form = Vec::new();
                write_json_time(&mut digest_form, at);
                prop_assert_eq!(String::from_utf8(digest_form).unwrap(), chrono);
                prop_assert_eq!(serde_json::to_string(&OptionalTime(Some(at))).unwrap(), serde_json::to_string(&Some(at)).unwrap());
            }

            #[test]
            fn the_state_json_is_the_serde_form(
                location in "\\PC{0,12}",
                owner in any::<String>(),
                secs in -62_000_000_000i64..250_000_000_000,
                nanos in nanos(),
                renewals in any::<u32>(),
                delay in proptest::option::of(any::<f64>().prop_filter("finite", |f| f.is_finite())),
                with_secondary in any::<bool>(),
                migrating in any::<bool>(),
            ) {
                // Nanoseconds past 1e9 (a leap second) are valid only in a minute's last second.
                let at = DateTime::from_timestamp(secs, nanos)
                    .or_else(|| DateTime::from_timestamp(secs, nanos % 1_000_000_000))
                    .unwrap();
                let mut doc = LocationDocument::new("r", location.clone());
                let mut section = locked_section(&location, &owner, at);
                let lock = section.lock.as_mut().unwrap();
                (lock.renewals, lock.convergence_delay_seconds) = (renewals, delay);
                lock.expires_at = at;
                doc.primary = section;
                doc.secondary = with_secondary.then(|| locked_section(&owner, &location, at));
                doc.migrating = migrating;
                prop_assert_eq!(state_json(&doc), String::from_utf8(serde_state_json(&doc)).unwrap());
            }
        }
    }

    #[test]
    fn token_is_128_bits_random_and_redacted_in_debug() {
        let (a, b) = (LockToken::generate(), LockToken::generate());
        assert_eq!(a.expose().len(), 32);
        assert!(!a.matches(&b));
        assert!(a.matches(&a.clone()));
        assert!(!format!("{a:?}").contains(a.expose()));
    }
}
