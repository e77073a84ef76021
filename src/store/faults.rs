//! Faults injected between a caller and any `LocationStore`, to rehearse the store
//! being slow, late, ambiguous or stale, deterministically.
//!
//! `FaultyStore` wraps a store and applies [`FaultRule`]s: each names the calls it hits
//! (by [`OpKind`], optionally only for one document id), a [`FaultAction`], and a
//! [`Trigger`]: a probability drawn from an RNG seeded once per wrapper, in call order
//! (the same seed and call order give the same faults), or the next N matching calls.
//! The first rule that matches a call and fires decides its one fault. Every call and
//! every fault injected is counted (`FaultyStore::stats`); rules can be added and
//! cleared while the store is in use, to switch a fault on for one step of a test.
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
//!   `StoreError::OutcomeUnknown` at `T`, else the real answer at `C`. A read waits
//!   `C` and is forwarded, or fails `StoreError::Unavailable` at `T` when `T < C`.
//! - `ambiguous`, **lost after applied**: forwarded, then a write answers
//!   `OutcomeUnknown` and a read `Unavailable`, whatever the store said.
//! - `fail`, a clean failure (database failure, partition): `Unavailable`, nothing
//!   forwarded, nothing applied.
//! - `replica-lag=D`, **replica lag beyond the bound**: a replica read answers an older
//!   version (below); the store breaking its staleness guarantee, outside the paper's
//!   model, which the probe and monitor must detect.
//!
//! Clock skew, the remaining fault of the campaign, is not a store fault: give one
//! instance a [`crate::clock::SkewedClock`].
//!
//! **Replica lag.** The wrapper keeps a short history (the last `HISTORY_PER_ID`
//! versions per id) of every version that passed through it: the results of creates and
//! replaces, and versions answered by reads, change-stream reads and scans. It knows
//! only those: versions written around it are unknown to it. A lagged replica read asks
//! the inner replica, then answers the newest known version committed at least `D`
//! before the inner replica's view, taking that view as late as the inner answer allows
//! (just before the commit of the known version that replaced it, else now): so the
//! lag adds to whatever lag the inner store provably has. When no known version is old
//! enough, the answer is `StoreError::NotFound`: the replica has not seen it yet.
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
//! action  = delay=D | late-ack=D | late-commit=D,timeout=D | ambiguous | fail | replica-lag=D
//! option  = xN        the next N matching calls (N >= 1), instead of "@P"
//!         | id=ID     only calls on this document id (no whitespace in ID)
//! ```
//!
//! `P` is a probability in 0..=1; with neither `@P` nor `xN` every matching call is hit.
//! `D` is a humantime duration (`500ms`, `3s`, `2m`), at most ten years. `replica-lag`
//! acts on `read_replica` only and needs it among the calls; `id=` needs a call that has
//! a document id (not `read_changes` or `scan` alone). Examples:
//!
//! ```text
//! replace:late-commit=3s,timeout=2s    create:ambiguous@0.1       read_replica:replica-lag=5s
//! replace:delay=500ms x3               read_write_region:fail@0.05
//! replace:late-ack=1s id=probe-0001
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::OpKind;

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
            FaultAction::Ambiguous | FaultAction::Fail => f.write_str(name),
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
    /// [`FaultAction::ReplicaLag`].
    ReplicaLag,
}

impl FaultKind {
    /// Every kind, in declaration order.
    pub const ALL: [FaultKind; 6] = [
        FaultKind::Delay,
        FaultKind::LateAck,
        FaultKind::Ambiguous,
        FaultKind::LateCommit,
        FaultKind::Fail,
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
            FaultKind::ReplicaLag => "replica-lag",
        }
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
    /// What it does to a call it hits.
    pub action: FaultAction,
    /// Which matching calls it hits.
    pub trigger: Trigger,
}

impl FaultRule {
    /// `action` on every call in `ops`, whatever the document.
    pub fn new(ops: impl Into<OpSet>, action: FaultAction) -> Self {
        Self { ops: ops.into(), id: None, action, trigger: Trigger::Probability(1.0) }
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

    /// Whether the rule applies to a call of `kind` on document `id` (`None`: a call
    /// without one), before its trigger is consulted.
    pub fn matches(&self, kind: OpKind, id: Option<&str>) -> bool {
        self.ops.contains(kind)
            && (kind == OpKind::ReadReplica || !matches!(self.action, FaultAction::ReplicaLag(_)))
            && self.id.as_deref().is_none_or(|want| id == Some(want))
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
        Ok(())
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
const ACTIONS: &str = "delay=D, late-ack=D, late-commit=D,timeout=D, ambiguous, fail or replica-lag=D";

fn parse_rule(spec: &str) -> Result<FaultRule, String> {
    let mut words = spec.split_whitespace();
    let head = words.next().ok_or("empty; expected <calls>:<action>[@P] [xN] [id=ID], e.g. replace:fail@0.1")?;
    let (calls, action) =
        head.split_once(':').ok_or_else(|| format!("{head:?} has no ':'; expected <calls>:<action>, e.g. replace:fail"))?;
    let ops = parse_calls(calls)?;
    let (action, probability) = match action.split_once('@') {
        Some((action, p)) => (action, Some(parse_probability(p)?)),
        None => (action, None),
    };
    let action = parse_action(action)?;

    let (mut count, mut id) = (None, None);
    for word in words {
        if let Some(value) = word.strip_prefix("id=") {
            if value.is_empty() {
                return Err("\"id=\" names no document".into());
            }
            if id.replace(value.to_owned()).is_some() {
                return Err(format!("{word:?}: id given twice"));
            }
        } else if let Some(n) = word.strip_prefix('x') {
            let n: u32 = n.parse().ok().filter(|n| *n >= 1).ok_or_else(|| format!("{word:?}: expected xN with N >= 1"))?;
            if count.replace(n).is_some() {
                return Err(format!("{word:?}: count given twice"));
            }
        } else {
            return Err(format!("unknown option {word:?}; expected xN or id=ID"));
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
    if id.is_some() && ops.iter().all(|k| matches!(k, OpKind::ReadChanges | OpKind::Scan)) {
        return Err(format!("id= never matches {calls:?}: those calls have no document id"));
    }
    Ok(FaultRule { ops, id, action, trigger })
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

fn parse_probability(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=1.0).contains(p))
        .ok_or_else(|| format!("probability \"@{text}\" is not a number from 0 to 1"))
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
