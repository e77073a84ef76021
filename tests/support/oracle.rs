//! The oracle of the fault campaign: judges what the fleet did against what the store
//! committed, in true time (the fleet's clock, not any instance's skewed one).
//!
//! - **Enforcement**: no write and no physical delete accepted while the store held a
//!   lock that forbids it. A lock forbids from the commit of the escalation that began its
//!   phase + the service's decision age (an operation decided on what the store said just
//!   before may land that long after; the swap waits that out before it copies) until
//!   its lease ends.
//! - **Data**: every key ends as its last acknowledged write or delete left it: no
//!   acknowledged write lost, no deleted item resurrected.
//! - **Holders**: no two tokens were ever told they hold the same resource at once.
//! - **Orphans**: every lock the store ever held has a token some orchestrator learned
//!   (its holder can release it, or it ends by its lease).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lockprobe::clock::to_chrono;
use lockprobe::routing::lifecycle;
use lockprobe::routing::{LocationDocument, Phase};
use lockprobe::store::{Change, Versioned};

/// A committed version and the instant from which the oracle takes it to be in force:
/// its commit time where the store's clock is true time (the memory store in the paused
/// campaign), or the instant its write was answered (no earlier than the commit) where
/// the store's commit times are coarse or on another clock (Cosmos DB's `_ts`). A later
/// instant can hide a violation, never invent one.
///
/// Where the commit time is not true time, the version may have been in force as early
/// as `sent`, the instant its write was sent: a version that lifts a lock (a release, a
/// swap) is taken to lift it from then when judging whether the lock was certainly in
/// force, so a slow answer (a planned failover holds writes until replication caught
/// up) cannot invent a violation either.
#[derive(Debug, Clone)]
pub struct Committed {
    /// In force from, at the latest.
    pub from: DateTime<Utc>,
    /// Its write was sent then: in force from then, at the earliest.
    pub sent: DateTime<Utc>,
    /// The version as stored (settled by the oracle with its own commit time).
    pub version: Versioned,
}

impl Committed {
    /// Versions of a store whose commit times are true time.
    pub fn exact(history: &[Change]) -> Vec<Committed> {
        history
            .iter()
            .map(|c| Committed {
                from: c.doc.committed_at,
                sent: c.doc.committed_at,
                version: Versioned::clone(&c.doc),
            })
            .collect()
    }
}
use serde_json::Value;

/// A user operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `GET`.
    Read,
    /// `PUT`.
    Write,
    /// `DELETE`.
    Delete,
}

/// One user operation and its answer.
#[derive(Debug, Clone)]
pub struct UserOp {
    /// True time the answer was heard. The service decided no later.
    pub at: DateTime<Utc>,
    /// The earliest true time the service can have decided: `at` in paused time (the
    /// service decides and answers at one instant, and nothing else moves the clock), the
    /// request's sending in real time (on a loaded machine an answer can wait long after
    /// its decision to be heard). An earlier instant can hide a violation, never invent
    /// one: the oracle judges the whole window.
    pub decided_from: DateTime<Utc>,
    /// Which instance served it.
    pub instance: usize,
    /// Resource id.
    pub resource: String,
    /// Item key.
    pub key: String,
    /// What it was.
    pub op: Op,
    /// The answer's status.
    pub status: u16,
    /// The value written, for writes.
    pub value: Option<Value>,
}

/// A lock view an orchestrator was given: it was told it holds `token` until `until`
/// (the newest view's lease). It holds it no longer once the store stopped carrying the
/// token (a release or swap, which the oracle reads from the history).
#[derive(Debug, Clone)]
pub struct Holding {
    /// Resource id.
    pub resource: String,
    /// The token (compared, never shown).
    pub token: String,
    /// True time of the answer.
    pub from: DateTime<Utc>,
    /// The lease end the answer showed.
    pub until: DateTime<Utc>,
    /// Who was told.
    pub orchestrator: usize,
}

/// How an item read back at the end.
#[derive(Debug, Clone, PartialEq)]
pub enum Final {
    /// 200 with this value.
    Present(Value),
    /// 200, tombstone.
    Tombstone,
    /// 404.
    Absent,
    /// Anything else.
    Other(u16),
}

/// A broken promise, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `enforcement`, `lost-write`, `resurrected`, `two-holders`, `orphan`.
    pub kind: &'static str,
    /// What exactly.
    pub detail: String,
}

/// What the campaign hands the oracle.
pub struct Evidence<'a> {
    /// Every committed version, in commit order.
    pub history: &'a [Committed],
    /// Every user operation.
    pub ops: &'a [UserOp],
    /// Every lock view an orchestrator was given.
    pub holdings: &'a [Holding],
    /// Every token some orchestrator learned.
    pub known_tokens: &'a HashSet<String>,
    /// How each (resource, key) read back once everything had settled.
    pub finals: &'a HashMap<(String, String), Final>,
    /// The service's decision age.
    pub decision_age: Duration,
}

/// A resource's settled versions, by commit time.
pub struct Timeline(Vec<(DateTime<Utc>, DateTime<Utc>, LocationDocument)>);

impl Timeline {
    /// The document the store held at `t`, taking each version in force from its answer.
    fn at(&self, t: DateTime<Utc>) -> Option<&LocationDocument> {
        let i = self.0.partition_point(|(from, _, _)| *from <= t);
        i.checked_sub(1).map(|i| &self.0[i].2)
    }

    /// Every version that may have been in force at some instant of `[start, end]`:
    /// the one in force at `start` by the answers, and every later one whose write was
    /// sent by `end` (it may have been committed before its answer, as early as then).
    fn possibly_in_force(&self, start: DateTime<Utc>, end: DateTime<Utc>) -> Vec<&LocationDocument> {
        let first = self.0.partition_point(|(from, _, _)| *from <= start);
        let mut docs: Vec<&LocationDocument> = first.checked_sub(1).map(|i| &self.0[i].2).into_iter().collect();
        docs.extend(self.0[first..].iter().filter(|(_, sent, _)| *sent <= end).map(|(_, _, doc)| doc));
        docs
    }
}

/// Every resource's settled versions.
pub fn timelines(history: &[Committed]) -> BTreeMap<String, Timeline> {
    let mut out: BTreeMap<String, Timeline> = BTreeMap::new();
    for c in history {
        let doc = lifecycle::settle(c.version.doc.clone(), c.version.committed_at);
        out.entry(doc.id.clone()).or_insert_with(|| Timeline(Vec::new())).0.push((c.from, c.sent.min(c.from), doc));
    }
    for timeline in out.values_mut() {
        timeline.0.sort_by_key(|(from, _, _)| *from);
    }
    out
}

/// The phase of `resource`'s lock in force at `t`, if any (lapsed locks are none).
pub fn phase_at(history_by_id: &BTreeMap<String, Timeline>, resource: &str, t: DateTime<Utc>) -> Option<Phase> {
    let doc = history_by_id.get(resource)?.at(t)?;
    doc.primary.lock.as_ref().filter(|l| t < l.expires_at).map(|l| l.phase)
}

/// Judges the evidence; an empty list is a clean run.
pub fn judge(e: &Evidence<'_>) -> Vec<Violation> {
    let by_id = timelines(e.history);
    let mut out = Vec::new();
    enforcement(e, &by_id, &mut out);
    data(e, &mut out);
    holders(e, &by_id, &mut out);
    orphans(e, &mut out);
    out
}

fn enforcement(e: &Evidence<'_>, by_id: &BTreeMap<String, Timeline>, out: &mut Vec<Violation>) {
    let age = to_chrono(e.decision_age);
    for op in e.ops {
        let forbidden_by = match (op.op, op.status) {
            (Op::Write, 200 | 201) => [Phase::Write].as_slice(),
            (Op::Delete, 204) => [Phase::HardDelete, Phase::Write].as_slice(),
            _ => continue,
        };
        let Some(timeline) = by_id.get(&op.resource) else { continue };
        let lock_at = |t| timeline.at(t).and_then(|doc| doc.primary.lock.clone());
        let Some(lock) = lock_at(op.decided_from) else { continue };
        let Some(since) = lock.phase_since else { continue };
        // In force over the whole window the decision may have fallen in: from its start
        // (+ the decision age) to the answer, the same phase of the same lock in every
        // version that may have been in force meanwhile.
        let same_throughout = timeline.possibly_in_force(op.decided_from, op.at).iter().all(|doc| {
            doc.primary
                .lock
                .as_ref()
                .is_some_and(|l| l.phase == lock.phase && l.phase_since == Some(since) && op.at < l.expires_at)
        });
        let in_force = since + age <= op.decided_from && same_throughout;
        if in_force && forbidden_by.contains(&lock.phase) {
            out.push(Violation {
                kind: "enforcement",
                detail: format!(
                    "{:?} {}/{} answered {} by instance {} at {} under a {} lock in force since {} until {}",
                    op.op, op.resource, op.key, op.status, op.instance, op.at, lock.phase, since, lock.expires_at
                ),
            });
        }
    }
}

fn data(e: &Evidence<'_>, out: &mut Vec<Violation>) {
    let mut last: HashMap<(&str, &str), &UserOp> = HashMap::new();
    for op in e.ops {
        let acknowledged = matches!((op.op, op.status), (Op::Write, 200 | 201) | (Op::Delete, 202 | 204));
        if acknowledged {
            let slot = last.entry((op.resource.as_str(), op.key.as_str())).or_insert(op);
            if op.at >= slot.at {
                *slot = op;
            }
        }
    }
    for ((resource, key), op) in last {
        let Some(seen) = e.finals.get(&(resource.to_owned(), key.to_owned())) else { continue };
        match (op.op, seen) {
            (Op::Write, Final::Present(v)) if Some(v) == op.value.as_ref() => {}
            (Op::Delete, Final::Absent | Final::Tombstone) => {}
            (Op::Write, seen) => out.push(Violation {
                kind: "lost-write",
                detail: format!(
                    "{resource}/{key}: write acknowledged ({}) at {} by instance {}, read back as {seen:?}",
                    op.status, op.at, op.instance
                ),
            }),
            (_, seen) => out.push(Violation {
                kind: "resurrected",
                detail: format!(
                    "{resource}/{key}: delete acknowledged ({}) at {}, read back as {seen:?}",
                    op.status, op.at
                ),
            }),
        }
    }
}

/// When `h` stopped holding: its lease's end, or the first commit after it was told it
/// holds that no longer carries its token, whichever came first.
fn held_until(h: &Holding, timeline: Option<&Timeline>) -> DateTime<Utc> {
    let gone = timeline.and_then(|t| {
        let start = t.0.partition_point(|(from, _, _)| *from <= h.from).saturating_sub(1);
        // From the earliest instant it may have been committed: the holding is never
        // taken to last longer than it may have.
        t.0[start..]
            .iter()
            .find(|(_, _, d)| d.primary.lock.as_ref().is_none_or(|l| l.token.expose() != h.token))
            .map(|(_, sent, _)| *sent)
    });
    gone.map_or(h.until, |g| g.min(h.until))
}

fn holders(e: &Evidence<'_>, by_id: &BTreeMap<String, Timeline>, out: &mut Vec<Violation>) {
    let mut by_resource: HashMap<&str, Vec<(&Holding, DateTime<Utc>)>> = HashMap::new();
    for h in e.holdings {
        by_resource.entry(h.resource.as_str()).or_default().push((h, held_until(h, by_id.get(&h.resource))));
    }
    for (resource, holdings) in by_resource {
        for (i, (a, a_until)) in holdings.iter().enumerate() {
            for (b, b_until) in &holdings[i + 1..] {
                let overlap = a.from < *b_until && b.from < *a_until;
                if a.token != b.token && overlap {
                    out.push(Violation {
                        kind: "two-holders",
                        detail: format!(
                            "{resource}: orchestrator {} held [{}, {a_until}) and orchestrator {} held [{}, {b_until})",
                            a.orchestrator, a.from, b.orchestrator, b.from
                        ),
                    });
                }
            }
        }
    }
}

fn orphans(e: &Evidence<'_>, out: &mut Vec<Violation>) {
    let mut seen = HashSet::new();
    for c in e.history {
        let Some(lock) = c.version.doc.primary.lock.as_ref() else { continue };
        let token = lock.token.expose().to_owned();
        if seen.insert(token.clone()) && !e.known_tokens.contains(&token) {
            out.push(Violation {
                kind: "orphan",
                detail: format!(
                    "{}: a lock committed at {} whose token no orchestrator learned",
                    c.version.doc.id, c.version.committed_at
                ),
            });
        }
    }
}
