//! Faults injected between a caller and any [`LocationStore`], to rehearse the store
//! being slow, late, ambiguous or stale, deterministically.
//!
//! [`FaultyStore`] wraps a store and applies [`FaultRule`]s: each names the calls it hits
//! (by [`OpKind`], optionally only for one document id), a [`FaultAction`], and a
//! [`Trigger`]: a probability drawn from an RNG seeded once per wrapper, in call order
//! (the same seed and call order give the same faults), or the next N matching calls.
//! The first rule that matches a call and fires decides its one fault. Every fault
//! injected is counted ([`FaultyStore::stats`]; calls are counted by the one counting
//! wrapper, [`super::counting`]); rules can be added and cleared while the store is in
//! use, to switch a fault on for one step of a test.
//!
//! What each action models, against the failure classes the scheme must survive (the
//! paper's Table 2: message loss and partition, database failure, stale caches and
//! replication lag; a lost or late message looks to the caller like one of these):
//!
//! - `delay=D`, **slow write**: the call is forwarded after `D`, so a write commits `D`
//!   after it was decided; the caller waits for it.
//! - `late-ack=D`, **late ack**: forwarded at once, answered `D` later; the write has
//!   landed and the writer does not know yet.
//! - `late-commit=C,timeout=T`, **ambiguous timeout** ("the store timed out at 2 s and
//!   committed at 3 s"): a write is forwarded after `C` by a task of its own, so it
//!   lands even when the caller gave up; with `T < C` the caller gets
//!   [`StoreError::OutcomeUnknown`] at `T`, else the real answer at `C`. A read waits
//!   `C` and is forwarded, or fails [`StoreError::Unavailable`] at `T` when `T < C`.
//!   [`FaultyStore::settle`] waits for the late commits still in flight.
//! - `ambiguous`, **lost after applied**: forwarded, then a write answers
//!   `OutcomeUnknown` and a read `Unavailable`, whatever the store said.
//! - `fail`, a clean failure (database failure, partition): `Unavailable`, nothing
//!   forwarded, nothing applied.
//! - `lost-race`, **a concurrent writer won**: a replace answers 412
//!   [`StoreError::PreconditionFailed`] and a create 409 [`StoreError::Conflict`], as if
//!   another writer had just written; nothing forwarded. It drives a caller's
//!   re-read-and-decide loop without a second writer.
//! - `replica-lag=D`, **replica lag beyond the bound**: a replica read answers an older
//!   version (below); the store breaking its staleness guarantee, outside the paper's
//!   model, which the probe and monitor must detect.
//!
//! Clock skew, the remaining fault of the campaign, is not a store fault: give one
//! instance a [`crate::clock::SkewedClock`].
//!
//! **Replica lag.** The wrapper keeps a short history (the last [`HISTORY_PER_ID`]
//! versions per id) of every version that passed through it: the results of creates and
//! replaces, and versions answered by reads, change-stream reads and scans. It knows
//! only those: versions written around it are unknown to it. A lagged replica read asks
//! the inner replica, then answers the newest known version committed at least `D`
//! before the inner replica's view, taking that view as late as the inner answer allows
//! (just before the commit of the known version that replaced it, else now): so the
//! lag adds to whatever lag the inner store provably has. When no known version is old
//! enough, the answer is [`StoreError::NotFound`]: the replica has not seen it yet.
//!
//! # Textual rules
//!
//! [`FaultRule`] parses from (and displays as) one line, for the command line:
//!
//! ```text
//! rule    = calls ":" action ["@" P] {" " option}
//! calls   = call {"," call}
//! call    = read_write_region | read_replica | create | replace | read_changes | scan
//!         | "*" (every call) | writes (create, replace) | reads (both point reads)
//! action  = delay=D | late-ack=D | late-commit=D,timeout=D | ambiguous | fail | lost-race
//!         | replica-lag=D
//! option  = xN        the next N matching calls (N >= 1), instead of "@P"
//!         | id=ID     only calls on this document id (no whitespace in ID)
//!         | step=S    only calls made inside lifecycle step S (see below)
//! ```
//!
//! `P` is a probability above 0 and at most 1 (a rule that could never fire is refused);
//! with neither `@P` nor `xN` every matching call is hit.
//! `D` is a humantime duration (`500ms`, `3s`, `2m`), at most ten years. `replica-lag`
//! acts on `read_replica` only and needs it among the calls; `lost-race` acts on writes
//! only and needs one among them; `id=` needs a call that has a document id (not
//! `read_changes` or `scan` alone). `step=` names the caller's step as [`in_step`] marks
//! it: the reference service marks each lock call's store calls with
//! [`LOCK_STEPS`] (`preLock`, `escalate`, `renew`, `swap`, `release`, `forceRelease`), so
//! `replace:delay=2s step=renew` slows the commit of renewals and nothing else. Examples:
//!
//! ```text
//! replace:late-commit=3s,timeout=2s    create:ambiguous@0.1       read_replica:replica-lag=5s
//! replace:delay=500ms x3               read_write_region:fail@0.05
//! replace:late-ack=1s id=probe-0001
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::sleep;

use super::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, OpKind, ReadFrom, ScanPage, StoreError, Versioned,
};
use crate::clock::{to_chrono, Clock};
use crate::document::LocationDocument;

/// The longest duration a textual rule accepts: ten years of 365.25 days, so `10y` passes
/// and anything longer is taken for a typo.
pub const MAX_FAULT_DURATION: Duration = Duration::from_secs(315_576_000);

/// What a fault does to the call it hits. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// Wait this long, then forward: a slow request, a late commit the caller waits for.
    Delay(Duration),
    /// Forward at once, answer this much later: the write has landed, the answer is late.
    LateAck(Duration),
    /// Forward, then answer `OutcomeUnknown` (write) or `Unavailable` (read).
    Ambiguous,
    /// A write lands after `commit_after` whether or not the caller still waits; the
    /// caller gives up with `OutcomeUnknown` after `timeout` if that is sooner.
    LateCommit {
        /// When the write is forwarded to the store.
        commit_after: Duration,
        /// When the caller gets its answer, if before `commit_after`.
        timeout: Duration,
    },
    /// Answer `Unavailable`; nothing is forwarded.
    Fail,
    /// Answer as if another writer had just won: `PreconditionFailed` to a replace,
    /// `Conflict` to a create; nothing is forwarded (a read it hits: `Unavailable`).
    LostRace,
    /// A replica read answers the version current this much further back.
    ReplicaLag(Duration),
}

impl FaultAction {
    /// Which kind of fault this is (for counters and reports).
    pub fn kind(&self) -> FaultKind {
        match self {
            FaultAction::Delay(_) => FaultKind::Delay,
            FaultAction::LateAck(_) => FaultKind::LateAck,
            FaultAction::Ambiguous => FaultKind::Ambiguous,
            FaultAction::LateCommit { .. } => FaultKind::LateCommit,
            FaultAction::Fail => FaultKind::Fail,
            FaultAction::LostRace => FaultKind::LostRace,
            FaultAction::ReplicaLag(_) => FaultKind::ReplicaLag,
        }
    }
}

impl fmt::Display for FaultAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.kind().as_str();
        match self {
            FaultAction::Delay(d) | FaultAction::LateAck(d) | FaultAction::ReplicaLag(d) => {
                write!(f, "{name}={}", Compact(*d))
            }
            FaultAction::LateCommit { commit_after, timeout } => {
                write!(f, "{name}={},timeout={}", Compact(*commit_after), Compact(*timeout))
            }
            FaultAction::Ambiguous | FaultAction::Fail | FaultAction::LostRace => f.write_str(name),
        }
    }
}

/// A duration as humantime writes it, without spaces (`1s500ms`), so it stays one word.
struct Compact(Duration);

impl fmt::Display for Compact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&humantime::format_duration(self.0).to_string().replace(' ', ""))
    }
}

/// The kinds of [`FaultAction`], without their parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// [`FaultAction::Delay`].
    Delay,
    /// [`FaultAction::LateAck`].
    LateAck,
    /// [`FaultAction::Ambiguous`].
    Ambiguous,
    /// [`FaultAction::LateCommit`].
    LateCommit,
    /// [`FaultAction::Fail`].
    Fail,
    /// [`FaultAction::LostRace`].
    LostRace,
    /// [`FaultAction::ReplicaLag`].
    ReplicaLag,
}

impl FaultKind {
    /// Every kind, in declaration order.
    pub const ALL: [FaultKind; 7] = [
        FaultKind::Delay,
        FaultKind::LateAck,
        FaultKind::Ambiguous,
        FaultKind::LateCommit,
        FaultKind::Fail,
        FaultKind::LostRace,
        FaultKind::ReplicaLag,
    ];

    /// The name used in textual rules and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Delay => "delay",
            FaultKind::LateAck => "late-ack",
            FaultKind::Ambiguous => "ambiguous",
            FaultKind::LateCommit => "late-commit",
            FaultKind::Fail => "fail",
            FaultKind::LostRace => "lost-race",
            FaultKind::ReplicaLag => "replica-lag",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A set of [`OpKind`]s: the calls a rule applies to.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpSet(u8);

impl OpSet {
    /// No call.
    pub const EMPTY: OpSet = OpSet(0);
    /// Every call (`*`).
    pub const ALL: OpSet = OpSet((1 << OpKind::ALL.len()) - 1);
    /// `create` and `replace` (`writes`).
    pub const WRITES: OpSet = OpSet::only(OpKind::Create).with(OpKind::Replace);
    /// Point reads from the write region or a replica (`reads`).
    pub const READS: OpSet = OpSet::only(OpKind::ReadWriteRegion).with(OpKind::ReadReplica);

    /// Just `kind`.
    pub const fn only(kind: OpKind) -> OpSet {
        OpSet(1 << op_index(kind))
    }

    /// This set and `kind`.
    pub const fn with(self, kind: OpKind) -> OpSet {
        OpSet(self.0 | OpSet::only(kind).0)
    }

    /// Whether `kind` is in the set.
    pub const fn contains(self, kind: OpKind) -> bool {
        self.0 & OpSet::only(kind).0 != 0
    }

    /// The kinds in the set, in [`OpKind::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = OpKind> {
        OpKind::ALL.into_iter().filter(move |k| self.contains(*k))
    }
}

impl From<OpKind> for OpSet {
    fn from(kind: OpKind) -> Self {
        OpSet::only(kind)
    }
}

impl fmt::Display for OpSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OpSet::ALL => f.write_str("*"),
            OpSet::WRITES => f.write_str("writes"),
            OpSet::READS => f.write_str("reads"),
            _ => {
                let names: Vec<_> = self.iter().map(OpKind::as_str).collect();
                f.write_str(&names.join(","))
            }
        }
    }
}

impl fmt::Debug for OpSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpSet({self})")
    }
}

/// Position of `kind` in [`OpKind::ALL`].
pub(crate) const fn op_index(kind: OpKind) -> usize {
    match kind {
        OpKind::ReadWriteRegion => 0,
        OpKind::ReadReplica => 1,
        OpKind::Create => 2,
        OpKind::Replace => 3,
        OpKind::ReadChanges => 4,
        OpKind::Scan => 5,
    }
}

/// Which of the matching calls a rule hits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// Each matching call with this probability, drawn from the wrapper's seeded RNG
    /// (`1.0`: every call; values outside 0..=1 act as the nearer bound, NaN as 0).
    Probability(f64),
    /// The next this many matching calls; the rule is dropped once they are used up.
    Next(u32),
}

/// One fault rule: which calls, which fault, how often.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// The calls it applies to.
    pub ops: OpSet,
    /// Only calls on this document id, when set (never change-stream reads or scans).
    pub id: Option<String>,
    /// Only calls made inside this step (see [`in_step`]), when set.
    pub step: Option<String>,
    /// What it does to a call it hits.
    pub action: FaultAction,
    /// Which matching calls it hits.
    pub trigger: Trigger,
}

impl FaultRule {
    /// `action` on every call in `ops`, whatever the document.
    pub fn new(ops: impl Into<OpSet>, action: FaultAction) -> Self {
        Self { ops: ops.into(), id: None, step: None, action, trigger: Trigger::Probability(1.0) }
    }

    /// Only the next `n` matching calls.
    pub fn times(self, n: u32) -> Self {
        Self { trigger: Trigger::Next(n), ..self }
    }

    /// Each matching call with probability `p`.
    pub fn probability(self, p: f64) -> Self {
        Self { trigger: Trigger::Probability(p), ..self }
    }

    /// Only calls on document `id`.
    pub fn for_id(self, id: impl Into<String>) -> Self {
        Self { id: Some(id.into()), ..self }
    }

    /// Only calls made inside step `step` (see [`in_step`]).
    pub fn in_step(self, step: impl Into<String>) -> Self {
        Self { step: Some(step.into()), ..self }
    }

    /// Whether the rule applies to a call of `kind` on document `id` (`None`: a call
    /// without one), before its trigger is consulted.
    pub fn matches(&self, kind: OpKind, id: Option<&str>) -> bool {
        self.ops.contains(kind)
            && (kind == OpKind::ReadReplica || !matches!(self.action, FaultAction::ReplicaLag(_)))
            && (kind.is_write() || self.action != FaultAction::LostRace)
            && self.id.as_deref().is_none_or(|want| id == Some(want))
            && self.step.as_deref().is_none_or(|want| current_step() == want)
    }
}

impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ops, self.action)?;
        match self.trigger {
            Trigger::Probability(p) if p >= 1.0 => {}
            Trigger::Probability(p) => write!(f, "@{p}")?,
            Trigger::Next(n) => write!(f, " x{n}")?,
        }
        if let Some(id) = &self.id {
            write!(f, " id={id}")?;
        }
        if let Some(step) = &self.step {
            write!(f, " step={step}")?;
        }
        Ok(())
    }
}

/// How many versions per document id the wrapper remembers for replica lag.
pub const HISTORY_PER_ID: usize = 32;

/// A [`LocationStore`] that forwards to another one and injects faults by its rules.
/// See the module documentation.
pub struct FaultyStore {
    inner: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    seed: u64,
    rules: Mutex<Rules>,
    seen: Arc<Mutex<Seen>>,
    late_commits: Mutex<Vec<JoinHandle<()>>>,
}

/// The rules, the RNG they draw from and the counters, under one lock so that draws
/// happen in call order.
struct Rules {
    rules: Vec<FaultRule>,
    rng: StdRng,
    stats: FaultStats,
    log: VecDeque<Injection>,
}

/// One fault injected: when (on the wrapper's clock), into which call, on which document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// When the call that got it was made.
    pub at: DateTime<Utc>,
    /// The call.
    pub op: OpKind,
    /// The document, for point calls.
    pub id: Option<String>,
    /// The fault.
    pub fault: FaultKind,
    /// The caller's step (see [`in_step`]), `other` outside any.
    pub step: &'static str,
}

/// How many injections [`FaultyStore::injections`] keeps (the newest).
pub const INJECTION_LOG: usize = 65_536;

/// What the wrapper has counted: faults injected by call kind and fault, and faults
/// injected by the step of the caller they hit (see [`in_step`]). Calls are counted by
/// `super::counting`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultStats {
    injected: [[u64; FaultKind::ALL.len()]; OpKind::ALL.len()],
    by_step: std::collections::BTreeMap<(&'static str, FaultKind), u64>,
}

tokio::task_local! {
    static STEP: &'static str;
}

/// Runs `fut` with its store calls counted under `step` (a lifecycle step such as
/// `preLock` or `swap`, a user operation such as `write`), so a fault campaign can show
/// which faults hit which step. Calls outside any step count under `other`.
pub async fn in_step<F: Future>(step: &'static str, fut: F) -> F::Output {
    STEP.scope(step, fut).await
}

/// The lifecycle steps the reference service marks its lock calls with (see
/// [`in_step`]); the names a `step=` option may give.
pub const LOCK_STEPS: [&str; 6] = ["preLock", "escalate", "renew", "swap", "release", "forceRelease"];

/// The step of the current call, `other` outside any.
fn current_step() -> &'static str {
    STEP.try_with(|s| *s).unwrap_or("other")
}

impl FaultStats {
    /// Faults of kind `fault` injected into calls of `kind`.
    pub fn injected(&self, kind: OpKind, fault: FaultKind) -> u64 {
        self.injected[op_index(kind)][fault.index()]
    }

    /// Faults injected, all kinds together.
    pub fn injected_total(&self) -> u64 {
        self.injected.iter().flatten().sum()
    }

    /// Every (call kind, fault kind, count) cell, zeros included, for report tables.
    pub fn injected_cells(&self) -> impl Iterator<Item = (OpKind, FaultKind, u64)> + '_ {
        OpKind::ALL
            .into_iter()
            .flat_map(move |op| FaultKind::ALL.into_iter().map(move |f| (op, f, self.injected(op, f))))
    }

    /// Faults of kind `fault` injected into calls made in `step` (see [`in_step`]).
    pub fn injected_in_step(&self, step: &str, fault: FaultKind) -> u64 {
        self.by_step.iter().filter(|((s, f), _)| *s == step && *f == fault).map(|(_, n)| n).sum()
    }

    /// Adds `other`'s counts to these (to total a campaign of many stores).
    pub fn add(&mut self, other: &FaultStats) {
        for (mine, theirs) in self.injected.iter_mut().flatten().zip(other.injected.iter().flatten()) {
            *mine += theirs;
        }
        for (key, n) in &other.by_step {
            *self.by_step.entry(*key).or_default() += n;
        }
    }
}

impl FaultyStore {
    /// Wraps `inner` with no rules yet; `clock` dates replica lag and `seed` fixes every
    /// probability draw.
    pub fn new(inner: Arc<dyn LocationStore>, clock: Arc<dyn Clock>, seed: u64) -> Self {
        Self {
            inner,
            clock,
            seed,
            rules: Mutex::new(Rules {
                rules: Vec::new(),
                rng: StdRng::seed_from_u64(seed),
                stats: FaultStats::default(),
                log: VecDeque::new(),
            }),
            seen: Arc::default(),
            late_commits: Mutex::default(),
        }
    }

    /// This store with `rule` added after the existing ones.
    pub fn with_rule(self, rule: FaultRule) -> Self {
        self.add_rule(rule);
        self
    }

    /// Adds `rule` after the existing ones, while the store is in use.
    pub fn add_rule(&self, rule: FaultRule) {
        lock(&self.rules).rules.push(rule);
    }

    /// Drops every rule (counters and the RNG carry on).
    pub fn clear_rules(&self) {
        lock(&self.rules).rules.clear();
    }

    /// The rules in force, counts of `Next` triggers as they stand now.
    pub fn rules(&self) -> Vec<FaultRule> {
        lock(&self.rules).rules.clone()
    }

    /// The seed every probability draw derives from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// What has been counted so far.
    pub fn stats(&self) -> FaultStats {
        lock(&self.rules).stats.clone()
    }

    /// The faults injected so far, oldest first (at most the newest [`INJECTION_LOG`]).
    pub fn injections(&self) -> Vec<Injection> {
        lock(&self.rules).log.iter().cloned().collect()
    }

    /// Waits until every late commit started so far has been forwarded and answered.
    pub async fn settle(&self) {
        loop {
            let tasks = std::mem::take(&mut *lock(&self.late_commits));
            if tasks.is_empty() {
                return;
            }
            for task in tasks {
                // A late commit that panicked has nothing left to wait for.
                let _ = task.await;
            }
        }
    }

    /// Counts a call and draws its fault: the first matching rule whose trigger fires.
    fn draw(&self, kind: OpKind, id: Option<&str>) -> Option<FaultAction> {
        let mut guard = lock(&self.rules);
        let Rules { rules, rng, stats, log } = &mut *guard;
        let hit = rules.iter_mut().position(|rule| rule.matches(kind, id) && fires(&mut rule.trigger, rng))?;
        let action = rules[hit].action.clone();
        if rules[hit].trigger == Trigger::Next(0) {
            rules.remove(hit);
        }
        stats.injected[op_index(kind)][action.kind().index()] += 1;
        let step = current_step();
        *stats.by_step.entry((step, action.kind())).or_default() += 1;
        if log.len() == INJECTION_LOG {
            log.pop_front();
        }
        log.push_back(Injection {
            at: self.clock.now(),
            op: kind,
            id: id.map(str::to_owned),
            fault: action.kind(),
            step,
        });
        Some(action)
    }

    /// Applies `action` around `forward`, a call to the inner store not yet started (for
    /// everything but late-commit writes and lagged replica reads).
    async fn apply<T>(
        &self,
        kind: OpKind,
        action: Option<FaultAction>,
        forward: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let Some(action) = action else { return forward.await };
        match action {
            FaultAction::Delay(d) => {
                sleep(d).await;
                forward.await
            }
            FaultAction::LateAck(d) => {
                let answer = forward.await;
                sleep(d).await;
                answer
            }
            FaultAction::Ambiguous => {
                let _ = forward.await;
                Err(if kind.is_write() {
                    StoreError::OutcomeUnknown("injected fault: ambiguous (the write was forwarded)".into())
                } else {
                    StoreError::Unavailable("injected fault: ambiguous".into())
                })
            }
            FaultAction::Fail => Err(StoreError::Unavailable("injected fault: fail (nothing forwarded)".into())),
            FaultAction::LostRace => Err(match kind {
                OpKind::Replace => StoreError::PreconditionFailed,
                OpKind::Create => StoreError::Conflict,
                _ => StoreError::Unavailable("injected fault: lost-race on a read (nothing forwarded)".into()),
            }),
            FaultAction::LateCommit { commit_after, timeout } if timeout < commit_after => {
                sleep(timeout).await;
                Err(StoreError::Unavailable(format!(
                    "injected fault: late-commit, no answer within {}",
                    Compact(timeout)
                )))
            }
            FaultAction::LateCommit { commit_after, .. } => {
                sleep(commit_after).await;
                forward.await
            }
            // Drawn for replica reads only, which take another path.
            FaultAction::ReplicaLag(_) => forward.await,
        }
    }

    async fn write(
        &self,
        kind: OpKind,
        doc: &LocationDocument,
        if_match: Option<&ETag>,
    ) -> Result<Committed, StoreError> {
        match self.draw(kind, Some(&doc.id)) {
            Some(FaultAction::LateCommit { commit_after, timeout }) => {
                self.late_commit(doc, if_match, commit_after, timeout).await
            }
            action => self.apply(kind, action, forward_write(&*self.inner, &self.seen, doc, if_match)).await,
        }
    }

    /// Forwards the write after `commit_after` from a task of its own, so it lands even
    /// when the caller has given up (or was cancelled).
    async fn late_commit(
        &self,
        doc: &LocationDocument,
        if_match: Option<&ETag>,
        commit_after: Duration,
        timeout: Duration,
    ) -> Result<Committed, StoreError> {
        let (inner, seen, doc, if_match) = (self.inner.clone(), self.seen.clone(), doc.clone(), if_match.cloned());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            sleep(commit_after).await;
            // The caller may have stopped listening: the write counts all the same.
            let _ = tx.send(forward_write(&*inner, &seen, &doc, if_match.as_ref()).await);
        });
        {
            let mut tasks = lock(&self.late_commits);
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
        if timeout < commit_after {
            sleep(timeout).await;
            return Err(StoreError::OutcomeUnknown(format!(
                "injected fault: late-commit, no answer within {}; the write lands after {}",
                Compact(timeout),
                Compact(commit_after)
            )));
        }
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::OutcomeUnknown("injected fault: late-commit task ended unanswered".into()))
        })
    }

    /// A replica read that lags `extra` beyond the inner replica (module documentation).
    async fn lagged_read(&self, id: &str, extra: Duration) -> Result<Versioned, StoreError> {
        let shown = self.inner.read(id, ReadFrom::Replica).await?;
        let now = self.clock.now();
        let mut seen = lock(&self.seen);
        seen.record(&shown);
        seen.lagged(&shown, now, extra).ok_or(StoreError::NotFound)
    }

    fn record_all<'a>(&self, versions: impl IntoIterator<Item = &'a Versioned>) {
        let mut seen = lock(&self.seen);
        versions.into_iter().for_each(|v| seen.record(v));
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("seed", &self.seed)
            .field("rules", &lock(&self.rules).rules)
            .finish_non_exhaustive()
    }
}

/// Whether a matching call is hit; uses up one of a `Next` trigger's calls when it is.
fn fires(trigger: &mut Trigger, rng: &mut StdRng) -> bool {
    match trigger {
        Trigger::Probability(p) => rng.random::<f64>() < *p,
        Trigger::Next(0) => false,
        Trigger::Next(n) => {
            *n -= 1;
            true
        }
    }
}

/// Creates (`if_match` None) or replaces, and remembers the version written.
async fn forward_write(
    inner: &dyn LocationStore,
    seen: &Mutex<Seen>,
    doc: &LocationDocument,
    if_match: Option<&ETag>,
) -> Result<Committed, StoreError> {
    let answer = match if_match {
        None => inner.create(doc).await,
        Some(etag) => inner.replace(doc, etag).await,
    };
    if let Ok(c) = &answer {
        lock(seen).record(&Versioned { doc: doc.clone(), etag: c.etag.clone(), committed_at: c.committed_at });
    }
    answer
}

/// A guard whether or not another thread panicked while holding the lock: every critical
/// section here leaves its data consistent, so a poisoned lock is no reason to stop.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Versions that passed through the wrapper: per id, oldest commit first, at most
/// [`HISTORY_PER_ID`].
#[derive(Debug, Default)]
struct Seen(HashMap<String, VecDeque<Versioned>>);

impl Seen {
    fn record(&mut self, v: &Versioned) {
        let versions = self.0.entry(v.doc.id.clone()).or_default();
        if versions.iter().any(|known| known.etag == v.etag) {
            return;
        }
        let at = versions.partition_point(|known| known.committed_at <= v.committed_at);
        versions.insert(at, v.clone());
        if versions.len() > HISTORY_PER_ID {
            versions.pop_front();
        }
    }

    /// The version a replica `extra` behind the one that answered `shown` would answer.
    fn lagged(&self, shown: &Versioned, now: DateTime<Utc>, extra: Duration) -> Option<Versioned> {
        let empty = VecDeque::new();
        let versions = self.0.get(&shown.doc.id).unwrap_or(&empty);
        let at = versions.iter().position(|v| v.etag == shown.etag);
        let successor = match at {
            Some(i) => versions.get(i + 1),
            None => versions.iter().find(|v| v.committed_at > shown.committed_at),
        };
        // The inner replica showed `shown`, so its view is older than the successor's commit.
        let view = successor.map_or(now, |s| s.committed_at.min(now));
        let horizon = view.checked_sub_signed(to_chrono(extra)).unwrap_or(DateTime::<Utc>::MIN_UTC);
        let candidates: Vec<&Versioned> = match at {
            Some(i) => versions.range(..=i).collect(),
            None => vec![shown],
        };
        candidates.into_iter().rev().find(|v| v.committed_at <= horizon).cloned()
    }
}

#[async_trait]
impl LocationStore for FaultyStore {
    fn region(&self) -> Option<String> {
        self.inner.region()
    }

    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        let kind = OpKind::read_from(from);
        match self.draw(kind, Some(id)) {
            Some(FaultAction::ReplicaLag(extra)) => self.lagged_read(id, extra).await,
            action => {
                let forward = async {
                    let answer = self.inner.read(id, from).await;
                    self.record_all(answer.as_ref().ok());
                    answer
                };
                self.apply(kind, action, forward).await
            }
        }
    }

    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        self.write(OpKind::Create, doc, None).await
    }

    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        self.write(OpKind::Replace, doc, Some(if_match)).await
    }

    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        let action = self.draw(OpKind::ReadChanges, None);
        let forward = async {
            let answer = self.inner.read_changes(cursor, limit).await;
            if let Ok(batch) = &answer {
                self.record_all(batch.changes.iter().map(|c| &*c.doc));
            }
            answer
        };
        self.apply(OpKind::ReadChanges, action, forward).await
    }

    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        let action = self.draw(OpKind::Scan, None);
        let forward = async {
            let answer = self.inner.scan(after, limit).await;
            if let Ok(page) = &answer {
                self.record_all(&page.documents);
            }
            answer
        };
        self.apply(OpKind::Scan, action, forward).await
    }
}

/// A textual fault rule that does not parse; the message names the bad part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fault rule {spec:?}: {problem}")]
pub struct FaultSpecError {
    /// The rule as given.
    pub spec: String,
    /// What is wrong with it.
    pub problem: String,
}

impl FromStr for FaultRule {
    type Err = FaultSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        parse_rule(spec).map_err(|problem| FaultSpecError { spec: spec.to_owned(), problem })
    }
}

const CALLS: &str = "read_write_region, read_replica, create, replace, read_changes, scan, *, writes or reads";
const ACTIONS: &str = "delay=D, late-ack=D, late-commit=D,timeout=D, ambiguous, fail, lost-race or replica-lag=D";

fn parse_rule(spec: &str) -> Result<FaultRule, String> {
    let mut words = spec.split_whitespace();
    let head = words.next().ok_or("empty; expected <calls>:<action>[@P] [xN] [id=ID], e.g. replace:fail@0.1")?;
    let (calls, action) = head
        .split_once(':')
        .ok_or_else(|| format!("{head:?} has no ':'; expected <calls>:<action>, e.g. replace:fail"))?;
    let ops = parse_calls(calls)?;
    let (action, probability) = match action.split_once('@') {
        Some((action, p)) => (action, Some(parse_probability(p)?)),
        None => (action, None),
    };
    let action = parse_action(action)?;

    let (mut count, mut id, mut step) = (None, None, None);
    for word in words {
        if let Some(value) = word.strip_prefix("id=") {
            if value.is_empty() {
                return Err("\"id=\" names no document".into());
            }
            if id.replace(value.to_owned()).is_some() {
                return Err(format!("{word:?}: id given twice"));
            }
        } else if let Some(value) = word.strip_prefix("step=") {
            if !LOCK_STEPS.contains(&value) {
                return Err(format!("{word:?}: unknown step; expected one of {}", LOCK_STEPS.join(", ")));
            }
            if step.replace(value.to_owned()).is_some() {
                return Err(format!("{word:?}: step given twice"));
            }
        } else if let Some(n) = word.strip_prefix('x') {
            let n: u32 =
                n.parse().ok().filter(|n| *n >= 1).ok_or_else(|| format!("{word:?}: expected xN with N >= 1"))?;
            if count.replace(n).is_some() {
                return Err(format!("{word:?}: count given twice"));
            }
        } else {
            return Err(format!("unknown option {word:?}; expected xN, id=ID or step=STEP"));
        }
    }
    let trigger = match (probability, count) {
        (Some(p), Some(n)) => return Err(format!("both \"@{p}\" and \"x{n}\"; give a probability or a count")),
        (Some(p), None) => Trigger::Probability(p),
        (None, Some(n)) => Trigger::Next(n),
        (None, None) => Trigger::Probability(1.0),
    };
    if matches!(action, FaultAction::ReplicaLag(_)) && !ops.contains(OpKind::ReadReplica) {
        return Err(format!("replica-lag acts on read_replica only, and {calls:?} does not include it"));
    }
    if action == FaultAction::LostRace && !ops.iter().any(OpKind::is_write) {
        return Err(format!("lost-race acts on writes only (create, replace), and {calls:?} has none"));
    }
    if id.is_some() && ops.iter().all(|k| matches!(k, OpKind::ReadChanges | OpKind::Scan)) {
        return Err(format!("id= never matches {calls:?}: those calls have no document id"));
    }
    Ok(FaultRule { ops, id, step, action, trigger })
}

fn parse_calls(text: &str) -> Result<OpSet, String> {
    let mut ops = OpSet::EMPTY;
    for name in text.split(',') {
        let set = match name {
            "*" => OpSet::ALL,
            "writes" => OpSet::WRITES,
            "reads" => OpSet::READS,
            _ => OpKind::ALL
                .into_iter()
                .find(|k| k.as_str() == name)
                .map(OpSet::only)
                .ok_or_else(|| format!("unknown call {name:?}; expected {CALLS}"))?,
        };
        ops = OpSet(ops.0 | set.0);
    }
    Ok(ops)
}

/// A probability in (0, 1]: a rule that can never fire (`@0`, or `@1e-400`, which is 0
/// as a number) is refused rather than kept as a fault that silently never happens.
fn parse_probability(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|p| *p > 0.0 && *p <= 1.0)
        .ok_or_else(|| format!("probability \"@{text}\" is not a number above 0 and at most 1"))
}

fn parse_action(text: &str) -> Result<FaultAction, String> {
    let (name, value) = match text.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (text, None),
    };
    let needs_value = || value.ok_or_else(|| format!("{name:?} needs a duration: {name}=D, e.g. {name}=2s"));
    let no_value = |action: FaultAction| match value {
        Some(v) => Err(format!("{name:?} takes no value (got {name}={v})")),
        None => Ok(action),
    };
    match name {
        "delay" => Ok(FaultAction::Delay(parse_duration(name, needs_value()?)?)),
        "late-ack" => Ok(FaultAction::LateAck(parse_duration(name, needs_value()?)?)),
        "replica-lag" => Ok(FaultAction::ReplicaLag(parse_duration(name, needs_value()?)?)),
        "ambiguous" => no_value(FaultAction::Ambiguous),
        "fail" => no_value(FaultAction::Fail),
        "lost-race" => no_value(FaultAction::LostRace),
        "late-commit" => {
            let value = needs_value()?;
            let (commit, rest) = value
                .split_once(',')
                .ok_or_else(|| format!("{text:?} needs a timeout: late-commit={value},timeout=D"))?;
            let timeout = rest
                .strip_prefix("timeout=")
                .ok_or_else(|| format!("unknown late-commit parameter {rest:?}; expected timeout=D"))?;
            Ok(FaultAction::LateCommit {
                commit_after: parse_duration(name, commit)?,
                timeout: parse_duration("timeout", timeout)?,
            })
        }
        _ => Err(format!("unknown action {name:?}; expected {ACTIONS}")),
    }
}

fn parse_duration(what: &str, text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| format!("{what}={text}: {e}"))?;
    if d > MAX_FAULT_DURATION {
        return Err(format!("{what}={text} is longer than ten years"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests;
