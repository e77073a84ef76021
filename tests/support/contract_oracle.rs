//! The campaign's second oracle: judges a run from the HTTP exchanges alone (what each
//! orchestrator and user sent, when, and what came back), by the rules of
//! `docs/contract.md`, each cited where it is applied. It imports nothing from the crate
//! (neither the lifecycle that settles documents nor the store's types), so a bug in the
//! routing library is not shared by its judge; the first oracle (`oracle.rs`) judges
//! the store's history with the library's own settling.
//!
//! Every judgement is over an operation's whole window, from the instant it was sent to
//! the instant its answer was heard: a lock is taken to be in force only if it was
//! certainly in force over all of it, so a slow answer can hide a violation but never
//! invent one.
//!
//! - **Holders** (contract, "The lock API", Pre-lock): a pre-lock granted while another
//!   token certainly held the resource. An approved force-release (contract 1.4) ends
//!   every lock of its resource granted before it was answered, from the instant it was
//!   sent (the approval names the lock by a fingerprint this oracle does not compute, so
//!   it ends each lock that may have been the one: that can hide a violation, never
//!   invent one).
//! - **Keys** (contract, 1.3, "How long a key is honoured"): a pre-lock repeated under
//!   its key granted a lock other than the first call's.
//! - **Enforcement** (contract, "The routing path and user data"): a write answered 200
//!   or 201, or a delete answered 204 or 202, under a write lock; a delete answered 204
//!   under a hard-delete lock; a read under a write lock that did not come through the
//!   write region (`Server-Timing: route;desc="read-through"`).
//! - **Registers** (contract, "The routing path and user data": reads are never blocked,
//!   a tombstone reads as one and is not resurrected, a write after the swap lands at the
//!   new location): each (resource, key) is a register whose value is a JSON value, a
//!   tombstone or nothing; the acknowledged writes and deletes, every read and the final
//!   read-back must be linearizable (stateright's `LinearizabilityTester`), the resource
//!   followed across its swaps.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Value;
use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

/// What was asked.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// `POST /lock` with `durationSeconds`.
    PreLock { duration: f64 },
    /// `POST /lock/escalate` to `phase` with `durationSeconds`.
    Escalate { phase: String, duration: f64 },
    /// `POST /lock/renew`.
    Renew,
    /// `POST /lock/swap`.
    Swap,
    /// `DELETE /lock`.
    Release,
    /// `POST /lock/force-release/{request}/approve` (contract 1.4): an operator's removal
    /// of the resource's lock, whichever token holds it (the exchange names no token).
    ForceRelease,
    /// `GET /items/{key}`.
    Read { key: String },
    /// `PUT /items/{key}`.
    Write { key: String, value: Value },
    /// `DELETE /items/{key}`.
    Delete { key: String },
}

/// One request and its answer, as the caller saw them.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// Who sent it (an orchestrator's or a user's name), for the report.
    pub actor: String,
    /// The resource id.
    pub resource: String,
    /// What was asked.
    pub call: Call,
    /// The lock token presented (escalate, renew, swap, release).
    pub token: Option<String>,
    /// The `Idempotency-Key` sent, if any.
    pub key: Option<String>,
    /// When it was sent.
    pub sent: DateTime<Utc>,
    /// When its answer was heard.
    pub answered: DateTime<Utc>,
    /// The answer's status.
    pub status: u16,
    /// The answer's JSON body (`Null` when empty).
    pub body: Value,
    /// The `desc` of `Server-Timing: route;...`, when the answer carried one.
    pub route: Option<String>,
}

impl Exchange {
    fn time(&self, field: &str) -> Option<DateTime<Utc>> {
        self.body[field].as_str().and_then(|t| DateTime::parse_from_rfc3339(t).ok()).map(|t| t.to_utc())
    }

    fn success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// A lock call that may have taken effect: succeeded, or its outcome is unknown (a
    /// refusal changes nothing: contract, "The lock API").
    fn may_have_taken_effect(&self) -> bool {
        self.success()
            || (self.status == 503 && self.body["type"].as_str().is_some_and(|t| t.ends_with("outcome-unknown")))
    }
}

/// A broken promise, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `two-holders`, `fresh-lock-for-a-key`, `write-under-write-lock`,
    /// `delete-under-write-lock`, `delete-under-hard-delete`, `read-not-read-through`,
    /// `not-linearizable`.
    pub kind: &'static str,
    /// What exactly, with the history that shows it.
    pub detail: String,
}

/// What the oracle is told besides the exchanges: the service's declared settings.
pub struct Declared {
    /// The service's maximum decision age (contract, "The routing path and user data":
    /// an operation whose routing read is older is refused).
    pub decision_age: Duration,
}

/// How each (resource, key) read back once everything settled: the read's exchange.
pub type Finals = BTreeMap<(String, String), Exchange>;

/// Judges the exchanges; an empty list is a clean run.
pub fn judge(exchanges: &[Exchange], finals: &Finals, declared: &Declared) -> Vec<Violation> {
    let locks = locks(exchanges);
    let mut out = Vec::new();
    holders(exchanges, &locks, &mut out);
    keys(exchanges, &mut out);
    enforcement(exchanges, &locks, declared, &mut out);
    registers(exchanges, finals, &mut out);
    out
}

/// One lock as its holder learned it: every exchange that presented or was granted its
/// token, in the order sent.
struct Lock<'a> {
    resource: &'a str,
    token: &'a str,
    granted: &'a Exchange,
    calls: Vec<&'a Exchange>,
}

impl Lock<'_> {
    /// The earliest instant at which the lock may have stopped being held, as far as
    /// the calls sent by `t` can tell: its lease as the newest answer heard by `t` showed
    /// it (a renewal's answer supersedes the lease before it: contract, "The lock API",
    /// Renew, and 1.1, "No resurrected lease", under which a renewal that could not
    /// take effect is 410, never 200); the lease an escalation sent by then set, or the
    /// earliest one it could have set when its outcome is unknown (counted from its
    /// decision, no earlier than its sending); a release or swap sent by then that may
    /// have taken effect. Certainly held until then.
    fn held_until(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        let mut end = self
            .calls
            .iter()
            .filter(|c| c.success() && c.answered <= t && c.time("expiresAt").is_some())
            .max_by_key(|c| c.answered)
            .and_then(|c| c.time("expiresAt"))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        for c in self.calls.iter().filter(|c| c.sent <= t) {
            match &c.call {
                Call::Release | Call::Swap | Call::ForceRelease if c.may_have_taken_effect() => end = end.min(c.sent),
                Call::Escalate { duration, .. } if c.success() && c.answered > t => {
                    end = end.min(c.time("expiresAt").unwrap_or(c.sent + seconds(*duration)));
                }
                Call::Escalate { duration, .. } if !c.success() && c.may_have_taken_effect() => {
                    end = end.min(c.sent + seconds(*duration));
                }
                _ => {}
            }
        }
        end
    }

    /// When `phase` certainly began for every instance: the first answer granting it,
    /// plus the decision age (an operation decided before the escalation's commit lands
    /// at most that much later: contract, "The routing path and user data" and "The lock
    /// API", Swap). `None` if no escalation to it succeeded.
    fn phase_from(&self, phase: &str, age: TimeDelta) -> Option<DateTime<Utc>> {
        self.calls
            .iter()
            .filter(|c| c.success() && matches!(&c.call, Call::Escalate { phase: p, .. } if p == phase))
            .map(|c| c.answered + age)
            .min()
    }

    /// The earliest instant `phase` may have ended: a later call that may have moved the
    /// lock on (an escalation to a later phase, a swap, a release), sent at or after its
    /// escalation.
    fn phase_may_end(&self, phase: &str) -> DateTime<Utc> {
        let order = |p: &str| match p {
            "preLock" => 0,
            "hardDelete" => 1,
            _ => 2,
        };
        self.calls
            .iter()
            .filter(|c| c.may_have_taken_effect())
            .filter(|c| match &c.call {
                Call::Escalate { phase: p, .. } => order(p) > order(phase),
                Call::Swap | Call::Release | Call::ForceRelease => true,
                _ => false,
            })
            .map(|c| c.sent)
            .min()
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    /// Whether `phase` was certainly in force over `[from, to]`.
    fn in_force(&self, phase: &str, from: DateTime<Utc>, to: DateTime<Utc>, age: TimeDelta) -> bool {
        let Some(start) = self.phase_from(phase, age) else { return false };
        start <= from && to < self.phase_may_end(phase) && to < self.held_until(from)
    }
}

fn seconds(s: f64) -> TimeDelta {
    TimeDelta::milliseconds((s * 1000.0) as i64)
}

/// Every lock some pre-lock was granted, with the calls that presented its token.
fn locks(exchanges: &[Exchange]) -> Vec<Lock<'_>> {
    let mut locks: Vec<Lock<'_>> = Vec::new();
    for e in exchanges {
        if matches!(e.call, Call::PreLock { .. }) && e.status == 201 {
            let Some(token) = e.body["token"].as_str() else { continue };
            // A repeated pre-lock answered with the same token is the same lock.
            if !locks.iter().any(|l| l.token == token) {
                locks.push(Lock { resource: &e.resource, token, granted: e, calls: vec![e] });
            }
        }
    }
    for e in exchanges {
        if matches!(e.call, Call::ForceRelease) {
            for lock in locks.iter_mut().filter(|l| l.resource == e.resource && l.granted.sent <= e.answered) {
                lock.calls.push(e);
            }
            continue;
        }
        let Some(token) = e.token.as_deref() else { continue };
        if let Some(lock) = locks.iter_mut().find(|l| l.token == token && l.resource == e.resource) {
            lock.calls.push(e);
        }
    }
    for lock in &mut locks {
        lock.calls.sort_by_key(|c| c.sent);
    }
    locks
}

/// Contract, "The lock API" (Pre-lock): "A second pre-lock while a lock lives is 423".
/// A grant whose whole window lies inside another token's certain holding is a second
/// holder.
fn holders(exchanges: &[Exchange], locks: &[Lock<'_>], out: &mut Vec<Violation>) {
    for e in exchanges {
        if !matches!(e.call, Call::PreLock { .. }) || e.status != 201 {
            continue;
        }
        let Some(token) = e.body["token"].as_str() else { continue };
        for other in locks.iter().filter(|l| l.resource == e.resource && l.token != token) {
            if other.granted.answered <= e.sent && e.answered < other.held_until(e.sent) {
                out.push(Violation {
                    kind: "two-holders",
                    detail: format!(
                        "{}: {} was granted a pre-lock (sent {}, answered {}) while the lock {} granted to {} at {} was held until at least {}",
                        e.resource,
                        e.actor,
                        e.sent,
                        e.answered,
                        fingerprint(other.token),
                        other.granted.actor,
                        other.granted.answered,
                        other.held_until(e.sent)
                    ),
                });
            }
        }
    }
}

/// Contract, 1.3, "How long a key is honoured": a repeated pre-lock gets the first
/// call's lock, or 409 or 410; never a fresh lock. Two grants under one key with
/// different tokens are a fresh lock.
fn keys(exchanges: &[Exchange], out: &mut Vec<Violation>) {
    let mut first: BTreeMap<(&str, &str), &Exchange> = BTreeMap::new();
    for e in exchanges.iter().filter(|e| matches!(e.call, Call::PreLock { .. }) && e.status == 201) {
        let (Some(key), Some(token)) = (e.key.as_deref(), e.body["token"].as_str()) else { continue };
        match first.get(&(e.resource.as_str(), key)) {
            None => {
                first.insert((e.resource.as_str(), key), e);
            }
            Some(earlier) if earlier.body["token"].as_str() != Some(token) => out.push(Violation {
                kind: "fresh-lock-for-a-key",
                detail: format!(
                    "{}: {} repeated a pre-lock under key {key} (sent {}) and was granted lock {}, not lock {} its first call got at {}",
                    e.resource,
                    e.actor,
                    e.sent,
                    fingerprint(token),
                    fingerprint(earlier.body["token"].as_str().unwrap_or_default()),
                    earlier.answered
                ),
            }),
            Some(_) => {}
        }
    }
}

/// Contract, "The routing path and user data": under a write lock a write or delete is
/// 423 and a read comes through the write region; under a hard-delete lock a delete is
/// 202, a tombstone.
fn enforcement(exchanges: &[Exchange], locks: &[Lock<'_>], declared: &Declared, out: &mut Vec<Violation>) {
    let age = TimeDelta::from_std(declared.decision_age).unwrap_or(TimeDelta::MAX);
    for e in exchanges {
        let (kind, phases): (&'static str, &[&str]) = match (&e.call, e.status) {
            (Call::Write { .. }, 200 | 201) => ("write-under-write-lock", &["write"]),
            (Call::Delete { .. }, 202) => ("delete-under-write-lock", &["write"]),
            (Call::Delete { .. }, 204) => ("delete-under-hard-delete", &["hardDelete", "write"]),
            (Call::Read { .. }, 200 | 404) if e.route.as_deref() != Some("read-through") => {
                ("read-not-read-through", &["write"])
            }
            _ => continue,
        };
        for lock in locks.iter().filter(|l| l.resource == e.resource) {
            for phase in phases {
                if lock.in_force(phase, e.sent, e.answered, age) {
                    let kind = if *phase == "write" && kind == "delete-under-hard-delete" {
                        "delete-under-write-lock"
                    } else {
                        kind
                    };
                    out.push(Violation {
                        kind,
                        detail: format!(
                            "{} {:?} on {} (sent {}, answered {} {}, route {:?}) under the {phase} lock {} granted to {}, in force from {:?}",
                            e.actor,
                            e.call,
                            e.resource,
                            e.sent,
                            e.status,
                            e.body,
                            e.route,
                            fingerprint(lock.token),
                            lock.granted.actor,
                            lock.phase_from(phase, age),
                        ),
                    });
                }
            }
        }
    }
}

/// An item's value as a register holds it.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Item {
    /// No item (404).
    #[default]
    Absent,
    /// A tombstone (deleted under a hard-delete lock).
    Tombstone,
    /// A value.
    Value(Value),
}

/// What an item exchange did to, or saw of, its register; `None` for what neither wrote
/// nor saw anything (a refusal, a delete of nothing).
fn register_op(e: &Exchange) -> Option<(RegisterOp<Item>, RegisterRet<Item>)> {
    let read = |item| Some((RegisterOp::Read, RegisterRet::ReadOk(item)));
    let write = |item| Some((RegisterOp::Write(item), RegisterRet::WriteOk));
    match (&e.call, e.status) {
        (Call::Write { value, .. }, 200 | 201) => write(Item::Value(value.clone())),
        (Call::Delete { .. }, 204) => write(Item::Absent),
        (Call::Delete { .. }, 202) => write(Item::Tombstone),
        (Call::Read { .. }, 200) if e.body["tombstone"] == Value::Bool(true) => read(Item::Tombstone),
        (Call::Read { .. }, 200) => read(Item::Value(e.body["value"].clone())),
        (Call::Read { .. }, 404) => read(Item::Absent),
        _ => None,
    }
}

/// Each (resource, key) as a register: its operations' invocations and returns in real
/// time, the final read-back after all of them, linearizable or reported with the
/// history.
fn registers(exchanges: &[Exchange], finals: &Finals, out: &mut Vec<Violation>) {
    let mut by_key: BTreeMap<(&str, &str), Vec<&Exchange>> = BTreeMap::new();
    for e in exchanges {
        if let Call::Read { key } | Call::Write { key, .. } | Call::Delete { key } = &e.call {
            by_key.entry((e.resource.as_str(), key.as_str())).or_default().push(e);
        }
    }
    for ((resource, key), final_read) in finals {
        by_key.entry((resource.as_str(), key.as_str())).or_default().push(final_read);
    }
    for ((resource, key), ops) in by_key {
        // Invocations and returns as events in real time; at one instant, returns first
        // (an operation answered at t precedes one sent at t).
        // An operation sent and answered at one instant (paused time) returns after every
        // invocation of that instant: concurrent with them, which allows more orders and
        // so never invents a violation.
        // (instant, rank at that instant, operation), invocation?, the exchange.
        type Event<'a> = ((DateTime<Utc>, u8, usize), bool, &'a Exchange);
        let mut events: Vec<Event<'_>> = Vec::new();
        for (i, e) in ops.iter().enumerate() {
            if register_op(e).is_some() {
                events.push(((e.sent, 1, i), true, e));
                let rank = if e.answered == e.sent { 2 } else { 0 };
                events.push(((e.answered, rank, i), false, e));
            }
        }
        events.sort_by_key(|(at, _, _)| *at);
        let mut tester = LinearizabilityTester::<usize, Register<Item>>::new(Register(Item::Absent));
        let actors: Vec<&str> = {
            let mut a: Vec<&str> = ops.iter().map(|e| e.actor.as_str()).collect();
            a.sort_unstable();
            a.dedup();
            a
        };
        let mut valid = true;
        for (_, invoke, e) in &events {
            let (op, ret) = register_op(e).expect("filtered");
            let thread = actors.binary_search(&e.actor.as_str()).unwrap_or(usize::MAX);
            let step = if *invoke {
                tester.on_invoke(thread, op).map(|_| ())
            } else {
                tester.on_return(thread, ret).map(|_| ())
            };
            if step.is_err() {
                valid = false;
                break;
            }
        }
        if !valid || !tester.is_consistent() {
            let history: Vec<String> = ops
                .iter()
                .filter(|e| register_op(e).is_some())
                .map(|e| {
                    format!("  {} [{} .. {}] {:?} -> {} {}", e.actor, e.sent, e.answered, e.call, e.status, e.body)
                })
                .collect();
            out.push(Violation {
                kind: "not-linearizable",
                detail: format!("{resource}/{key}: no order of these explains what was read:\n{}", history.join("\n")),
            });
        }
    }
}

/// A token is never shown: the first 8 hex digits of a hash of it, to tell locks apart.
fn fingerprint(token: &str) -> String {
    let hash = token.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("#{:08x}", hash >> 32)
}
