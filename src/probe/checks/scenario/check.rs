//! One check on one resource: the assertion helpers every part of a cycle uses, the
//! lock it holds, and its release on every way out.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::window::{Held, Lease, Stamp, Tally, Window};
use super::{lock, Abort, Item, Recorder, Scenario, MAIN_CHECK};
use crate::probe::checks::report::Assertion;
use crate::probe::checks::settings::{escalation_wait, SKEW_MARGIN_WAIT};
use crate::probe::checks::state::PreLockIntent;
use crate::probe::checks::target::{CallKey, Reply, TargetError};
use crate::probe::checks::vocabulary::{Op, Outcome, Phase, UserOp};

/// One check on one resource, with the lock it holds (if any).
pub(super) struct Check<'a> {
    pub(super) sc: &'a Scenario,
    pub(super) rec: &'a Recorder,
    pub(super) name: String,
    pub(super) resource: String,
    pub(super) token: Mutex<Option<String>>,
    pub(super) items: Mutex<BTreeMap<String, Item>>,
    /// Lock calls made so far: the next goes to instance `lock_calls % instances`, so
    /// every instance's lock API is exercised, not only the first one's.
    lock_calls: AtomicUsize,
    /// The last lock view this check was given (its timestamps).
    pub(super) last_view: Mutex<Option<LockTimes>>,
    /// What is left of the time this check may spend waiting out clocks that differ
    /// within a service's skew margin ([`SKEW_MARGIN_WAIT`] in all, so the worst-case
    /// cycle stays what `check-config` computes).
    skew_allowance: Mutex<Duration>,
    /// When the answer of the last granted pre-lock arrived (monotonic and wall clock).
    pub(super) pre_lock_answered: Mutex<Option<(Instant, DateTime<Utc>)>>,
    /// When the last pre-lock was sent and answered.
    pub(super) pre_lock_window: Mutex<Option<Window>>,
}

/// The timestamps of a lock view, as the contract names them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct LockTimes {
    pub(super) acquired_at: DateTime<Utc>,
    pub(super) effective_at: DateTime<Utc>,
    pub(super) expires_at: DateTime<Utc>,
    pub(super) pre_lock_expires_at: DateTime<Utc>,
    pub(super) max_expires_at: DateTime<Utc>,
}

impl LockTimes {
    /// The timestamps of the lock view `body`, or the first field missing or unreadable.
    pub(super) fn of(body: &Value) -> Result<Self, String> {
        let at = |name: &str| {
            body.get(name)
                .and_then(Value::as_str)
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.to_utc())
                .ok_or_else(|| format!("no RFC 3339 {name}"))
        };
        Ok(Self {
            acquired_at: at("acquiredAt")?,
            effective_at: at("effectiveAt")?,
            expires_at: at("expiresAt")?,
            pre_lock_expires_at: at("preLockExpiresAt")?,
            max_expires_at: at("maxExpiresAt")?,
        })
    }

    /// The first of the contract's orderings this view breaks: `acquiredAt <=
    /// effectiveAt <= expiresAt <= preLockExpiresAt <= maxExpiresAt` (a phase's lease
    /// never outlives the pre-lock, which never outlives the maximum).
    pub(super) fn disorder(&self) -> Option<String> {
        let chain = [
            ("acquiredAt", self.acquired_at),
            ("effectiveAt", self.effective_at),
            ("expiresAt", self.expires_at),
            ("preLockExpiresAt", self.pre_lock_expires_at),
            ("maxExpiresAt", self.max_expires_at),
        ];
        chain
            .windows(2)
            .find(|w| w[0].1 > w[1].1)
            .map(|w| format!("{} {} is after {} {}", w[0].0, w[0].1.to_rfc3339(), w[1].0, w[1].1.to_rfc3339()))
    }

    /// At least the longest pre-lock the service grants, as its views show it: from
    /// `acquiredAt` to `maxExpiresAt`, so whether a service counts its maximum from
    /// the acquisition or from `effectiveAt` (the reference does), a request longer
    /// than this is over it.
    pub(super) fn maximum(&self) -> Option<Duration> {
        (self.max_expires_at - self.acquired_at).to_std().ok()
    }
}

/// Whether `lease` was certainly in force over `window`: `Err` says why it was not
/// certain (an operation sent after the lease's latest end is not held to it either).
pub(super) fn in_force(lease: &Lease, window: &Window) -> Result<(), String> {
    match lease.held_over(window) {
        Held::Certainly => Ok(()),
        Held::Over => Err("sent after the lease's latest end".into()),
        Held::Uncertain(why) => Err(why),
    }
}

/// What a user operation is held to ([`Check::user_op_under`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Hold<'l> {
    /// Nothing: it is judged as it is.
    Nothing,
    /// A lease that must have been in force over the whole decision window.
    InForce(&'l Lease),
    /// A lease that must have been over when the operation was sent: past its latest
    /// end, and past the enforcement the service announced after it, if it announced
    /// one (a `423`'s `Retry-After`, counted from when that answer arrived).
    Over(&'l Lease, Option<(Stamp, Duration)>),
}

impl Hold<'_> {
    /// `None` for an operation held to nothing; otherwise whether it can be judged.
    fn judge(&self, window: &Window) -> Option<Result<(), String>> {
        match *self {
            Hold::Nothing => None,
            Hold::InForce(lease) => Some(in_force(lease, window)),
            Hold::Over(lease, announced) => Some(match lease.over_when_sent(window, Duration::ZERO) {
                Held::Over => match announced {
                    Some((at, for_)) if !window.sent_at_least(for_, &at) => Err(format!(
                        "sent before the {:.0}s the service announced it would still enforce the lease had passed",
                        for_.as_secs_f64()
                    )),
                    _ => Ok(()),
                },
                Held::Certainly => Err("sent while the lease was in force".into()),
                Held::Uncertain(why) => Err(why),
            }),
        }
    }
}

/// A lock call's answer with the probe's wall-clock times around it, so instants the
/// service stamped can be related to the probe's clock.
pub(super) struct Timed {
    pub(super) reply: Reply,
    /// Halfway between sending and receiving, by the probe's clock.
    pub(super) midpoint: DateTime<Utc>,
    /// When the call that gave `reply` was sent and answered.
    pub(super) window: Window,
}

/// Observed outcome of a user operation, in the vocabulary of the enforcement table.
pub(super) fn classify(op: UserOp, r: &Reply) -> Outcome {
    let tombstone = r.body.get("tombstone") == Some(&Value::Bool(true));
    match (op, r.status) {
        (_, 423) if r.retry_after.is_some() => Outcome::Block,
        (_, 423) => Outcome::BlockWithoutRetryAfter,
        (UserOp::Read, 200) if tombstone => Outcome::Tombstone,
        (UserOp::Read, 200) => Outcome::Allow,
        (UserOp::Read | UserOp::Delete, 404) => Outcome::Absent,
        (UserOp::Write, 200 | 201) => Outcome::Allow,
        (UserOp::Delete, 204) => Outcome::Allow,
        (UserOp::Delete, 202) if tombstone => Outcome::Tombstone,
        _ => r.outcome(),
    }
}

/// An instant by the service's clock, with the offset from the probe's clock learnt
/// when it was read (service minus probe).
#[derive(Debug, Clone, Copy)]
pub(super) struct ServiceInstant {
    pub(super) at: DateTime<Utc>,
    pub(super) offset: TimeDelta,
}

/// Seconds from `from` to `to`, never negative.
pub(super) fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).to_std().map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The token of a lock call that succeeded, i.e. a lock that is now live.
pub(super) fn granted(r: &Reply) -> Option<&str> {
    (200..300).contains(&r.status).then(|| r.str_field("token")).flatten()
}

/// An assertion in the making: what a check does (phase, operation, instance) and what
/// it must give. [`Expect::observed`] records it; [`Expect::call`] and
/// [`Expect::lock_op`] make the request it is about first.
pub(super) struct Expect<'c, 'a> {
    check: &'c Check<'a>,
    phase: Phase,
    op: Op,
    instance: Option<usize>,
    expected: Outcome,
    detail: Option<String>,
}

impl Expect<'_, '_> {
    /// The check is made on one instance.
    pub(super) fn on(self, instance: usize) -> Self {
        Self { instance: Some(instance), ..self }
    }

    /// Context for a reader (timings, values); never a token.
    pub(super) fn detail(self, detail: impl Into<String>) -> Self {
        Self { detail: Some(detail.into()), ..self }
    }

    /// Records what was observed; returns whether it was what was expected.
    pub(super) fn observed(self, observed: impl Into<Outcome>, duration: Duration) -> bool {
        let detail = self.detail.clone();
        self.record(observed.into(), duration, detail)
    }

    /// Records what an operation the check meant to hold to a lock observed, if its
    /// decision window allowed that (`held` is `Ok`); otherwise records it as
    /// inconclusive, with why. Either way the check's tally counts it. Returns whether
    /// it was judged and was what was expected.
    pub(super) fn observed_if(
        self,
        held: Result<(), String>,
        observed: impl Into<Outcome>,
        duration: Duration,
    ) -> bool {
        let c = self.check;
        match held {
            Ok(()) => {
                c.count_held(self.phase);
                self.observed(observed, duration)
            }
            Err(why) => {
                c.count_inconclusive(self.phase, why.clone());
                self.undecided(observed, duration, why);
                false
            }
        }
    }

    /// Records an assertion the check could not decide, with why, without counting it
    /// in the check's tally (a caller that summarises several operations counts them).
    pub(super) fn undecided(&self, observed: impl Into<Outcome>, duration: Duration, why: String) {
        self.record_with(observed.into(), duration, self.detail.clone(), Some(why));
    }

    fn record(&self, observed: Outcome, duration: Duration, detail: Option<String>) -> bool {
        self.record_with(observed, duration, detail, None)
    }

    fn record_with(
        &self,
        observed: Outcome,
        duration: Duration,
        detail: Option<String>,
        inconclusive: Option<String>,
    ) -> bool {
        let c = self.check;
        let a = Assertion {
            check: c.name.clone(),
            phase: self.phase,
            op: self.op,
            instance: self.instance.map(|i| c.sc.settings.instances[i].clone()),
            passed: self.expected == observed && inconclusive.is_none(),
            expected: self.expected.clone(),
            observed,
            at: Utc::now(),
            duration,
            detail,
            inconclusive,
        };
        let passed = a.passed;
        c.sc.observer.assertion(c.target(), &a);
        lock(&c.rec.assertions).push(a);
        passed
    }

    /// Awaits a request; a transport failure becomes a failed assertion and aborts.
    pub(super) async fn call(&self, fut: impl Future<Output = Result<Reply, TargetError>>) -> Result<Reply, Abort> {
        let started = Instant::now();
        match fut.await {
            Ok(r) => Ok(r),
            Err(e) => {
                let observed = match &e {
                    TargetError::OutsidePrefix { .. } => Outcome::RefusedOutsidePrefix,
                    TargetError::Transport(_) => Outcome::Unreachable,
                };
                self.record(observed, started.elapsed(), Some(e.to_string()));
                match e {
                    TargetError::OutsidePrefix { .. } => Err(Abort::Stop),
                    TargetError::Transport(m) => Err(Abort::Transport(m)),
                }
            }
        }
    }

    /// A lock call whose answer must be the expected one (`200`, `423 lock-held`, ...).
    pub(super) async fn lock_op(
        self,
        fut: impl Future<Output = Result<Reply, TargetError>>,
    ) -> Result<(Reply, bool), Abort> {
        let r = self.call(fut).await?;
        let ok = self.observed(r.outcome(), r.elapsed);
        Ok((r, ok))
    }

    /// A lock call the rest of the check stands on: the check stops unless it gave the
    /// expected answer (the failed assertion is already recorded).
    pub(super) async fn must_lock_op(
        self,
        fut: impl Future<Output = Result<Reply, TargetError>>,
    ) -> Result<Reply, Abort> {
        match self.lock_op(fut).await? {
            (r, true) => Ok(r),
            (_, false) => Err(Abort::Stop),
        }
    }
}

impl<'a> Check<'a> {
    pub(super) fn new(sc: &'a Scenario, rec: &'a Recorder, name: &str, resource: &str) -> Self {
        Self {
            sc,
            rec,
            name: name.to_string(),
            resource: resource.to_string(),
            token: Mutex::new(None),
            items: Mutex::new(BTreeMap::new()),
            lock_calls: AtomicUsize::new(0),
            last_view: Mutex::new(None),
            pre_lock_answered: Mutex::new(None),
            pre_lock_window: Mutex::new(None),
            skew_allowance: Mutex::new(SKEW_MARGIN_WAIT),
        }
    }

    /// Now, on both of the probe's clocks.
    pub(super) fn stamp(&self) -> Stamp {
        Stamp::now(&*self.sc.settings.clock)
    }

    /// Makes a request and returns its answer with its decision window.
    pub(super) async fn windowed<T>(&self, fut: impl Future<Output = T>) -> (T, Window) {
        let sent = self.stamp();
        let out = fut.await;
        (out, Window { sent, answered: self.stamp() })
    }

    /// Counts an operation (in `phase`) this check held to a lock.
    pub(super) fn count_held(&self, phase: Phase) {
        lock(&self.rec.tallies).entry(self.name.clone()).or_insert_with(|| (phase, Tally::default())).1.count_held();
    }

    /// Counts an operation (in `phase`) this check meant to hold to a lock and could not.
    pub(super) fn count_inconclusive(&self, phase: Phase, why: String) {
        lock(&self.rec.tallies)
            .entry(self.name.clone())
            .or_insert_with(|| (phase, Tally::default()))
            .1
            .count_inconclusive(why);
    }

    /// A lease of `lease` granted by this check's last pre-lock, if it made one.
    pub(super) fn pre_lock_lease(&self, lease: Duration) -> Option<Lease> {
        self.pre_lock_window().map(|w| Lease::granted(w, lease))
    }

    /// When this check's last pre-lock was sent and answered.
    pub(super) fn pre_lock_window(&self) -> Option<Window> {
        *lock(&self.pre_lock_window)
    }

    /// Counts an operation (in `phase`) that could not be held to a lock and is made
    /// again in a fresh attempt.
    pub(super) fn count_retried(&self, phase: Phase) {
        lock(&self.rec.tallies).entry(self.name.clone()).or_insert_with(|| (phase, Tally::default())).1.count_retried();
    }

    /// Takes up to `want` of this check's skew allowance; zero once it is spent.
    pub(super) fn take_skew_allowance(&self, want: Duration) -> Duration {
        let mut left = lock(&self.skew_allowance);
        let take = want.min(*left);
        *left -= take;
        take
    }

    /// Starts this check's lock calls on instance `first` (checks start on different
    /// instances, so together they cover every instance).
    pub(super) fn starting_at(self, first: usize) -> Self {
        self.lock_calls.store(first, Ordering::Relaxed);
        self
    }

    /// The instance the next lock call will go to (without taking the turn).
    pub(super) fn next_lock_instance(&self) -> usize {
        self.lock_calls.load(Ordering::Relaxed) % self.instances()
    }

    /// The instance the next lock call goes to.
    pub(super) fn lock_instance(&self) -> usize {
        self.lock_calls.fetch_add(1, Ordering::Relaxed) % self.instances()
    }

    /// Asserts that the lock view `r` is consistent (`phase/lock-view`) and remembers
    /// its timestamps; returns them when they are readable.
    pub(super) fn check_lock_view(&self, phase: Phase, r: &Reply) -> Option<LockTimes> {
        let (observed, detail, times) = match LockTimes::of(&r.body) {
            Ok(t) => match t.disorder() {
                None => (Outcome::Consistent, None, Some(t)),
                Some(why) => (Outcome::Inconsistent, Some(why), Some(t)),
            },
            Err(why) => (Outcome::Inconsistent, Some(why), None),
        };
        let expect = self.expect(phase, Op::LockView, Outcome::Consistent);
        let expect = match detail {
            Some(d) => expect.detail(d),
            None => expect,
        };
        expect.observed(observed, Duration::ZERO);
        if let Some(t) = times {
            *lock(&self.last_view) = Some(t);
        }
        times
    }

    /// A lock call made with its wall-clock midpoint.
    pub(super) async fn timed<F>(&self, fut: F) -> (Result<Reply, TargetError>, DateTime<Utc>)
    where
        F: Future<Output = Result<Reply, TargetError>>,
    {
        let sent = Utc::now();
        let out = fut.await;
        let received = Utc::now();
        (out, sent + (received - sent) / 2)
    }

    pub(super) fn target(&self) -> &str {
        &self.sc.settings.name
    }

    /// Records that the main walk's step `phase` began at `at` (the other checks' steps
    /// are not drawn: they overlap, each on its own resource).
    pub(super) fn mark_at(&self, phase: Phase, at: DateTime<Utc>) {
        if self.name == MAIN_CHECK {
            lock(&self.rec.steps).push((phase, at));
        }
    }

    /// Records that the main walk's step `phase` begins now.
    pub(super) fn mark(&self, phase: Phase) {
        self.mark_at(phase, Utc::now());
    }

    pub(super) fn instances(&self) -> usize {
        self.sc.settings.instances.len()
    }

    pub(super) fn step(&self, message: &str) {
        self.sc.observer.step(self.target(), &self.name, message);
    }

    /// Runs `body`, stopping it on cancellation, then releases whatever lock is still held,
    /// including one whose pre-lock was in flight when the body stopped: its journaled
    /// key asks the service for the token the call was granted, if it was.
    pub(super) async fn guarded<F>(&self, cancel: &CancellationToken, body: F) -> Result<(), Abort>
    where
        F: Future<Output = Result<(), Abort>>,
    {
        let out = tokio::select! {
            out = body => out,
            _ = cancel.cancelled() => Err(Abort::Cancelled),
        };
        self.release_if_held().await;
        self.sc.recover_resources(std::slice::from_ref(&self.resource)).await;
        out
    }

    /// Starts an assertion: in `phase`, `op` must give `expected`.
    pub(super) fn expect(&self, phase: Phase, op: impl Into<Op>, expected: impl Into<Outcome>) -> Expect<'_, 'a> {
        Expect { check: self, phase, op: op.into(), instance: None, expected: expected.into(), detail: None }
    }

    /// Escalates from `held` (in force since `since`, by the service's clock) to `next`,
    /// records how long `held` was held by the service's timestamps, and returns when
    /// `next` began by them (see [`Check::phase_start`]).
    pub(super) async fn escalate_after(
        &self,
        held: Phase,
        since: ServiceInstant,
        next: Phase,
        lease: Duration,
    ) -> Result<ServiceInstant, Abort> {
        self.step(&format!("escalating to {next}"));
        let timed = self.escalate_to(next, lease).await?;
        let began = self.phase_start(&timed, lease, since.offset);
        lock(&self.rec.phases).push((held, seconds_between(since.at, began.at)));
        Ok(began)
    }

    /// When the phase an escalation answered with began, by the service's clock: its
    /// lease runs `lease` from the escalation, so `expiresAt - lease`, unless the lease
    /// was capped (then the probe's midpoint of the call, moved by the offset between
    /// the clocks learnt earlier).
    fn phase_start(&self, timed: &Timed, lease: Duration, offset: TimeDelta) -> ServiceInstant {
        let uncapped = LockTimes::of(&timed.reply.body).ok().and_then(|t| {
            let start = t.expires_at.checked_sub_signed(TimeDelta::from_std(lease).ok()?)?;
            (t.expires_at < t.pre_lock_expires_at.min(t.max_expires_at)).then_some(start)
        });
        match uncapped {
            Some(at) => ServiceInstant { at, offset: at - timed.midpoint },
            None => ServiceInstant { at: timed.midpoint + offset, offset },
        }
    }

    /// Escalates the held lock to `phase` (`hardDelete` or `write`) with `lease`; the check
    /// stops unless the service agrees. The lock view answered is checked.
    pub(super) async fn escalate_to(&self, phase: Phase, lease: Duration) -> Result<Timed, Abort> {
        let (out, midpoint, window, at) = self.escalation(phase, lease).await;
        let reply = self.expect(phase, Op::Escalate, Outcome::ok()).on(at).must_lock_op(async { out }).await?;
        self.escalated(phase, reply, midpoint, window)
    }

    /// [`Self::escalate_to`] a lease so short that the escalation's answer may come after
    /// it: a call whose outcome was unknown is repeated under its key, and a repeat that
    /// arrives past the lease's end is rightly answered `410 lock-expired` (the lease it
    /// asked for has lapsed). Such an answer, when the whole call took the lease or longer,
    /// cannot say whether the escalation took: inconclusive, and the check stops
    /// (`Ok(None)`) without a failure.
    pub(super) async fn escalate_to_short(&self, phase: Phase, lease: Duration) -> Result<Option<Timed>, Abort> {
        let (out, midpoint, window, at) = self.escalation(phase, lease).await;
        if let Ok(r) = &out {
            let took = window.answered.mono.saturating_duration_since(window.sent.mono);
            if r.outcome() == Outcome::lock_expired() && took >= lease {
                let why = format!(
                    "answered {:.3}s after it was first sent, past the {:.3}s lease it asked for: its outcome was unknown until that lease could have lapsed",
                    took.as_secs_f64(),
                    lease.as_secs_f64()
                );
                self.expect(phase, Op::Escalate, Outcome::ok()).on(at).observed_if(Err(why), r.outcome(), r.elapsed);
                return Ok(None);
            }
        }
        let reply = self.expect(phase, Op::Escalate, Outcome::ok()).on(at).must_lock_op(async { out }).await?;
        self.escalated(phase, reply, midpoint, window).map(Some)
    }

    /// One escalation of the held lock to `phase`, asked again (within the skew
    /// allowance) while the service answers it is too early; the answer, its midpoint and
    /// window, and the instance it went to.
    async fn escalation(
        &self,
        phase: Phase,
        lease: Duration,
    ) -> (Result<Reply, TargetError>, DateTime<Utc>, Window, usize) {
        let c = &self.sc.client;
        let token = self.token();
        let at = self.lock_instance();
        let send = |k| c.escalate(at, &self.resource, &token, phase.as_str(), lease, k);
        let ((mut out, mut midpoint), mut window) =
            self.windowed(self.timed(c.until_known(&CallKey::fresh(), send))).await;
        // The probe waited until effectiveAt by its own clock; an instance whose clock is
        // behind (within the service's skew margin) still calls that too early, which is
        // safe and honest. Ask again, as an orchestrator would, within the allowance.
        while matches!(&out, Ok(r) if r.outcome() == Outcome::invalid_transition()) {
            let wait = self.take_skew_allowance(self.sc.settings.poll_interval.max(Duration::from_millis(50)));
            if wait.is_zero() {
                break;
            }
            tokio::time::sleep(wait).await;
            ((out, midpoint), window) = self.windowed(self.timed(c.until_known(&CallKey::fresh(), send))).await;
        }
        (out, midpoint, window, at)
    }

    /// Records a granted escalation to `phase`: the walk's step, its lock view.
    fn escalated(&self, phase: Phase, reply: Reply, midpoint: DateTime<Utc>, window: Window) -> Result<Timed, Abort> {
        self.mark(phase);
        self.check_lock_view(phase, &reply);
        Ok(Timed { reply, midpoint, window })
    }

    /// User operations on every instance, each `(op, key kind, expected outcome)` on the
    /// key `<kind>-<instance>`.
    pub(super) async fn on_every_instance(&self, phase: Phase, ops: [(UserOp, &str, Outcome); 3]) -> Result<(), Abort> {
        for i in 0..self.instances() {
            for (op, kind, expected) in &ops {
                self.user_op(phase, *op, i, &format!("{kind}-{i}"), expected.clone()).await?;
            }
        }
        Ok(())
    }

    /// A user operation on `instance` whose enforcement outcome must be `expected`.
    pub(super) async fn user_op(
        &self,
        phase: Phase,
        op: UserOp,
        instance: usize,
        key: &str,
        expected: Outcome,
    ) -> Result<Reply, Abort> {
        Ok(self.user_op_under(phase, op, instance, key, expected, Hold::Nothing).await?.0)
    }

    /// [`Self::user_op`] held to a lease: judged only if its decision window allows
    /// that (the lease certainly in force, or certainly over, over the whole window),
    /// inconclusive otherwise ([`super::window`]). Returns the answer and whether it was
    /// judged.
    pub(super) async fn user_op_under(
        &self,
        phase: Phase,
        op: UserOp,
        instance: usize,
        key: &str,
        expected: Outcome,
        hold: Hold<'_>,
    ) -> Result<(Reply, bool), Abort> {
        let c = &self.sc.client;
        let res = &self.resource;
        let value = json!({"probe": self.target(), "key": key, "phase": phase, "at": Utc::now().to_rfc3339()});
        let expect = self.expect(phase, op, expected).on(instance);
        let request = async {
            match op {
                UserOp::Read => expect.call(c.read(instance, res, key)).await,
                UserOp::Write => expect.call(c.write(instance, res, key, &value)).await,
                UserOp::Delete => expect.call(c.delete(instance, res, key)).await,
            }
        };
        let (r, window) = self.windowed(request).await;
        let r = r?;
        let observed = classify(op, &r);
        // Keep the model of what must exist after the swap in line with what the service did.
        {
            let mut items = lock(&self.items);
            match (op, &observed) {
                (UserOp::Write, Outcome::Allow) => {
                    items.insert(key.to_string(), Item::Present(value));
                }
                (UserOp::Delete, Outcome::Allow) => {
                    items.insert(key.to_string(), Item::Absent);
                }
                (UserOp::Delete, Outcome::Tombstone) => {
                    items.insert(key.to_string(), Item::Tombstone);
                }
                _ => {}
            }
        }
        let expect = match r.status {
            423 => expect.detail(format!("Retry-After: {}", r.retry_after.as_deref().unwrap_or("missing"))),
            _ => expect,
        };
        let judged = match hold.judge(&window) {
            None => {
                expect.observed(observed, r.elapsed);
                true
            }
            Some(held) => {
                let judged = held.is_ok();
                expect.observed_if(held, observed, r.elapsed);
                judged
            }
        };
        Ok((r, judged))
    }

    /// Pre-locks this check's resource. The request and its idempotency key are
    /// journaled before it is sent, so a cycle that is cancelled or killed while the call
    /// is in flight can still learn the token and release. With `check_replay`, the
    /// pre-lock is then repeated under the same key, which a contract 1.1 service must
    /// answer with the same token and never with a fresh lock.
    pub(super) async fn pre_lock(
        &self,
        phase: Phase,
        target_location: Option<&str>,
        check_replay: bool,
    ) -> Result<(Reply, bool), Abort> {
        self.pre_lock_primed(phase, target_location, check_replay, false).await
    }

    /// [`Self::pre_lock`]; with `prime`, the other instances' caches are primed
    /// ([`Self::prime_caches`]) after the intent is journaled and right before the call,
    /// so that nothing the probe does (a journal write that waits on a busy disk) comes
    /// between the primed copy and the lock: the worst case the declared delay must cover
    /// is then what the walk measures, on a quiet machine or a loaded one.
    pub(super) async fn pre_lock_primed(
        &self,
        phase: Phase,
        target_location: Option<&str>,
        check_replay: bool,
        prime: bool,
    ) -> Result<(Reply, bool), Abort> {
        let s = &self.sc.settings;
        let key = CallKey::fresh();
        let intent = PreLockIntent {
            key: key.as_str().to_owned(),
            owner: s.owner.clone(),
            duration_seconds: s.leases.pre_lock.as_secs_f64(),
            target_location: target_location.map(str::to_owned),
        };
        if let Err(e) = self.sc.state.record_intent(&s.name, &self.resource, Some(intent)) {
            let abort = Abort::journal(&self.resource, &e);
            tracing::error!(error = %e, resource = %self.resource, "pre-lock not sent: its intent could not be recorded in the state file");
            return Err(abort);
        }
        if prime {
            if let Err(abort) = self.prime_caches(self.next_lock_instance()).await {
                // Nothing was sent: the intent is not a call whose outcome is unknown.
                let _ = self.sc.state.forget(&s.name, &self.resource);
                return Err(abort);
            }
        }
        let c = &self.sc.client;
        let at = self.lock_instance();
        let send = |k| c.pre_lock(at, &self.resource, &s.owner, s.leases.pre_lock, target_location, k);
        let expect = self.expect(phase, Op::PreLock, Outcome::created()).on(at);
        let (out, window) = self.windowed(expect.lock_op(c.until_known(&key, send))).await;
        *lock(&self.pre_lock_answered) = Some((Instant::now(), Utc::now()));
        *lock(&self.pre_lock_window) = Some(window);
        if let Ok((r, ok)) = &out {
            // A token in a success answer is a live lock, even under an unexpected status:
            // holding it is what gets it released.
            if let Some(token) = granted(r) {
                self.hold(token);
                self.check_lock_view(phase, r);
                if check_replay {
                    self.replay_pre_lock(phase, &key, token, target_location).await;
                }
                return out;
            }
            if *ok {
                self.expect(phase, Op::PreLock, Outcome::Token).observed(Outcome::NoToken, r.elapsed);
                let _ = self.sc.state.forget(&s.name, &self.resource);
                return Err(Abort::Stop);
            }
        }
        // A refusal took no effect; an answer still unknown (503, no answer) keeps its
        // journal entry, so the way out of the check repeats it and learns the outcome.
        let refused = matches!(&out, Ok((r, _)) if (400..500).contains(&r.status));
        if refused {
            let _ = self.sc.state.forget(&s.name, &self.resource);
        }
        out
    }

    /// Repeats a granted pre-lock under its key: the same token back means the service
    /// keeps idempotency keys (contract 1.1); `423 lock-held` means it ignores them
    /// (contract 1.0), which the report notes as not checked and the probe then lives
    /// with (a lock whose answer is lost is left to its lease), unless the instance
    /// declares contract 1.1 or later (`Lockprobe-Contract`), for which it is a failure;
    /// a different token is a second lock granted over the first, a failure, and that
    /// lock is released at once.
    async fn replay_pre_lock(&self, phase: Phase, key: &CallKey, token: &str, target_location: Option<&str>) {
        let s = &self.sc.settings;
        let c = &self.sc.client;
        // On another instance when there is one: the key must be known to all of them.
        let at = self.lock_instance();
        let send = |k| c.pre_lock(at, &self.resource, &s.owner, s.leases.pre_lock, target_location, k);
        let Ok(r) = c.until_known(key, send).await else { return };
        let observed = match granted(&r) {
            Some(again) if again == token => Outcome::SameToken,
            Some(_) => Outcome::FreshLock,
            // Excused only where the instance does not declare a contract that keeps
            // keys: one that declares 1.1 or later and ignores them fails its own.
            None if r.outcome() == Outcome::lock_held() && c.declared_by(at).at_least(1, 1) != Some(true) => {
                self.note(format!(
                    "{}: not checked: pre-lock-replay (the service ignores Idempotency-Key, as contract 1.0 does, and declares no contract version): a lock call whose answer is lost cannot be recovered, only left to its lease",
                    self.name
                ));
                return;
            }
            None => r.outcome(),
        };
        let fresh_lock = observed == Outcome::FreshLock;
        self.expect(phase, Op::PreLockReplay, Outcome::SameToken).on(at).observed(observed, r.elapsed);
        if fresh_lock {
            self.release_unexpected(&r).await;
        }
    }

    /// Adds a note to the cycle's report (what a reader of the report must know that is
    /// not an assertion).
    pub(super) fn note(&self, note: String) {
        self.step(&note);
        tracing::warn!(target_name = %self.target(), "{note}");
        let mut notes = lock(&self.rec.notes);
        if !notes.contains(&note) {
            notes.push(note);
        }
    }

    /// Releases a lock the service granted where it should have refused (a second
    /// pre-lock, an extra winner of a race): the check has failed already, and the lock
    /// must not outlive it.
    pub(super) async fn release_unexpected(&self, r: &Reply) {
        let Some(token) = granted(r) else {
            return;
        };
        let c = &self.sc.client;
        let at = self.lock_instance();
        let send = |k| c.release(at, &self.resource, token, k);
        if let Ok(r) = c.until_known(&CallKey::fresh(), send).await {
            if !matches!(r.status, 204 | 410) {
                tracing::warn!(resource = %self.resource, status = r.status, "could not release a lock granted in error");
            }
        }
    }

    pub(super) fn hold(&self, token: &str) {
        *lock(&self.token) = Some(token.to_string());
        if let Err(e) = self.sc.state.record_token(self.target(), &self.resource, token) {
            tracing::warn!(error = %e, "cannot record lock token in state file");
        }
    }

    pub(super) fn token(&self) -> String {
        lock(&self.token).clone().unwrap_or_default()
    }

    pub(super) fn dropped(&self) {
        *lock(&self.token) = None;
        if let Err(e) = self.sc.state.forget(self.target(), &self.resource) {
            tracing::warn!(error = %e, "cannot update state file");
        }
    }

    pub(super) async fn release_if_held(&self) {
        let Some(token) = lock(&self.token).clone() else {
            return;
        };
        self.step("releasing the lock");
        self.mark(Phase::Cleanup);
        let started = Instant::now();
        let c = &self.sc.client;
        let at = self.lock_instance();
        let send = |k| c.release(at, &self.resource, &token, k);
        match c.until_known(&CallKey::fresh(), send).await {
            Ok(r) => {
                // 410: the lease already ended, nothing is held any more.
                let observed = if matches!(r.status, 204 | 410) { Outcome::Released } else { r.outcome() };
                self.expect(Phase::Cleanup, Op::Release, Outcome::Released).observed(observed, r.elapsed);
                if matches!(r.status, 204 | 409 | 410) {
                    self.dropped();
                }
            }
            Err(e) => {
                // Keep the state entry: the next start retries the release.
                self.expect(Phase::Cleanup, Op::Release, Outcome::Released)
                    .detail(e.to_string())
                    .observed(Outcome::Unreachable, started.elapsed());
            }
        }
    }

    /// The convergence delay a lock view declares; `None` when it is missing or not a
    /// usable number of seconds.
    pub(super) fn declared(&self, r: &Reply) -> Option<Duration> {
        r.body.get("convergenceDelaySeconds").and_then(Value::as_f64).and_then(|d| Duration::try_from_secs_f64(d).ok())
    }

    /// How long to wait, from the pre-lock's answer `r`, before escalating: until the
    /// later of the `effectiveAt` it shows and the answer + the declared delay, plus the
    /// buffer (contract 1.1: a pre-lock the store committed late, or a store whose
    /// commit time is coarse, starts later than the answer suggests); never less than
    /// the replication bound.
    pub(super) fn escalation_wait(&self, r: &Reply, declared: Duration) -> Duration {
        let shown = r
            .str_field("effectiveAt")
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .and_then(|t| (t.to_utc() - Utc::now()).to_std().ok())
            .unwrap_or_default();
        let s = &self.sc.settings;
        escalation_wait(declared.max(shown), s.buffer, s.replication_bound)
    }
}
