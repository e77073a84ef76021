//! One check on one resource: the assertion helpers every part of a cycle uses, the
//! lock it holds, and its release on every way out.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{lock, Abort, Item, Recorder, Scenario};
use crate::probe::report::{Assertion, BLOCK_WITHOUT_RETRY_AFTER};
use crate::probe::state::PreLockIntent;
use crate::probe::target::{CallKey, Reply, TargetError};

/// One check on one resource, with the lock it holds (if any).
pub(super) struct Check<'a> {
    pub(super) sc: &'a Scenario,
    pub(super) rec: &'a Recorder,
    pub(super) name: String,
    pub(super) resource: String,
    pub(super) token: Mutex<Option<String>>,
    pub(super) items: Mutex<BTreeMap<String, Item>>,
}

/// Observed outcome of a user operation, in the vocabulary of the enforcement table.
pub(super) fn classify(op: &str, r: &Reply) -> String {
    match (op, r.status) {
        (_, 423) if r.retry_after.is_some() => "block".into(),
        (_, 423) => BLOCK_WITHOUT_RETRY_AFTER.into(),
        ("read", 200) if r.body.get("tombstone") == Some(&Value::Bool(true)) => "tombstone".into(),
        ("read", 200) => "allow".into(),
        ("read", 404) => "absent".into(),
        ("write", 200 | 201) => "allow".into(),
        ("delete", 204) => "allow".into(),
        ("delete", 202) if r.body.get("tombstone") == Some(&Value::Bool(true)) => {
            "tombstone".into()
        }
        ("delete", 404) => "absent".into(),
        _ => r.outcome(),
    }
}

/// The token of a lock call that succeeded, i.e. a lock that is now live.
pub(super) fn granted(r: &Reply) -> Option<&str> {
    (200..300).contains(&r.status).then(|| r.str_field("token")).flatten()
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
        }
    }

    pub(super) fn target(&self) -> &str {
        &self.sc.settings.name
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

    #[allow(clippy::too_many_arguments)]
    pub(super) fn assert(
        &self,
        phase: &str,
        op: &str,
        instance: Option<usize>,
        expected: &str,
        observed: &str,
        duration: Duration,
        detail: Option<String>,
    ) -> bool {
        let a = Assertion {
            check: self.name.clone(),
            phase: phase.into(),
            op: op.into(),
            instance: instance.map(|i| self.sc.settings.instances[i].clone()),
            expected: expected.into(),
            observed: observed.into(),
            passed: expected == observed,
            at: Utc::now(),
            duration,
            detail,
        };
        let passed = a.passed;
        self.sc.observer.assertion(self.target(), &a);
        lock(&self.rec.assertions).push(a);
        passed
    }

    /// Awaits a request; a transport failure becomes a failed assertion and aborts.
    pub(super) async fn call(
        &self,
        phase: &str,
        op: &str,
        instance: Option<usize>,
        expected: &str,
        fut: impl Future<Output = Result<Reply, TargetError>>,
    ) -> Result<Reply, Abort> {
        let started = Instant::now();
        match fut.await {
            Ok(r) => {
                if let Some(t) = &r.timing {
                    if t.source == "read-through" {
                        lock(&self.rec.read_through).push(t.duration.as_secs_f64());
                    }
                }
                Ok(r)
            }
            Err(e) => {
                let observed = match &e {
                    TargetError::OutsidePrefix { .. } => "refused-outside-prefix",
                    TargetError::Transport(_) => "unreachable",
                };
                self.assert(
                    phase,
                    op,
                    instance,
                    expected,
                    observed,
                    started.elapsed(),
                    Some(e.to_string()),
                );
                match e {
                    TargetError::OutsidePrefix { .. } => Err(Abort::Stop),
                    TargetError::Transport(m) => Err(Abort::Transport(m)),
                }
            }
        }
    }

    /// A lock call whose outcome must be `expected` (`"200"`, `"423 lock-held"`, ...).
    pub(super) async fn lock_op(
        &self,
        phase: &str,
        op: &str,
        expected: &str,
        fut: impl Future<Output = Result<Reply, TargetError>>,
    ) -> Result<(Reply, bool), Abort> {
        let r = self.call(phase, op, None, expected, fut).await?;
        let ok = self.assert(phase, op, None, expected, &r.outcome(), r.elapsed, None);
        Ok((r, ok))
    }

    /// A lock call the rest of the check stands on: the check stops unless it gave
    /// `expected` (the failed assertion is already recorded).
    pub(super) async fn must_lock_op(
        &self,
        phase: &str,
        op: &str,
        expected: &str,
        fut: impl Future<Output = Result<Reply, TargetError>>,
    ) -> Result<Reply, Abort> {
        match self.lock_op(phase, op, expected, fut).await? {
            (r, true) => Ok(r),
            (_, false) => Err(Abort::Stop),
        }
    }

    /// Escalates from `held` (in force since `since`) to `next`, records how long `held`
    /// was held, and returns when `next` began.
    pub(super) async fn escalate_after(
        &self,
        held: &str,
        since: Instant,
        next: &str,
        lease: Duration,
    ) -> Result<Instant, Abort> {
        self.step(&format!("escalating to {next}"));
        self.escalate_to(next, lease).await?;
        lock(&self.rec.phases).push((held.into(), since.elapsed().as_secs_f64()));
        Ok(Instant::now())
    }

    /// Escalates the held lock to `phase` (`hardDelete` or `write`) with `lease`; the check
    /// stops unless the service agrees.
    pub(super) async fn escalate_to(&self, phase: &str, lease: Duration) -> Result<Reply, Abort> {
        let c = &self.sc.client;
        let token = self.token();
        let send = |k| c.escalate(0, &self.resource, &token, phase, lease, k);
        self.must_lock_op(phase, "escalate", "200", c.until_known(&CallKey::fresh(), send)).await
    }

    /// User operations on every instance, each `(op, key kind, expected outcome)` on the
    /// key `<kind>-<instance>`.
    pub(super) async fn on_every_instance(
        &self,
        phase: &str,
        ops: [(&str, &str, &str); 3],
    ) -> Result<(), Abort> {
        for i in 0..self.instances() {
            for (op, kind, expected) in ops {
                self.user_op(phase, op, i, &format!("{kind}-{i}"), expected)
                    .await?;
            }
        }
        Ok(())
    }

    /// A user operation on `instance` whose enforcement outcome must be `expected`.
    pub(super) async fn user_op(
        &self,
        phase: &str,
        op: &str,
        instance: usize,
        key: &str,
        expected: &str,
    ) -> Result<Reply, Abort> {
        let c = &self.sc.client;
        let res = &self.resource;
        let value = json!({"probe": self.target(), "key": key, "phase": phase, "at": Utc::now().to_rfc3339()});
        let r = match op {
            "read" => {
                self.call(
                    phase,
                    op,
                    Some(instance),
                    expected,
                    c.read(instance, res, key),
                )
                .await?
            }
            "write" => {
                self.call(
                    phase,
                    op,
                    Some(instance),
                    expected,
                    c.write(instance, res, key, &value),
                )
                .await?
            }
            _ => {
                self.call(
                    phase,
                    op,
                    Some(instance),
                    expected,
                    c.delete(instance, res, key),
                )
                .await?
            }
        };
        let observed = classify(op, &r);
        // Keep the model of what must exist after the swap in line with what the service did.
        {
            let mut items = lock(&self.items);
            match (op, observed.as_str()) {
                ("write", "allow") => {
                    items.insert(key.to_string(), Item::Present(value));
                }
                ("delete", "allow") => {
                    items.insert(key.to_string(), Item::Absent);
                }
                ("delete", "tombstone") => {
                    items.insert(key.to_string(), Item::Tombstone);
                }
                _ => {}
            }
        }
        let detail = (r.status == 423).then(|| {
            format!(
                "Retry-After: {}",
                r.retry_after.as_deref().unwrap_or("missing")
            )
        });
        self.assert(
            phase,
            op,
            Some(instance),
            expected,
            &observed,
            r.elapsed,
            detail,
        );
        Ok(r)
    }

    /// Pre-locks this check's resource. The request and its idempotency key are
    /// journaled before it is sent, so a cycle that is cancelled or killed while the call
    /// is in flight can still learn the token and release. With `check_replay`, the
    /// pre-lock is then repeated under the same key, which a contract 1.1 service must
    /// answer with the same token and never with a fresh lock.
    pub(super) async fn pre_lock(
        &self,
        phase: &str,
        target_location: Option<&str>,
        check_replay: bool,
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
            tracing::warn!(error = %e, "cannot record pre-lock intent in state file");
        }
        let c = &self.sc.client;
        let send = |k| c.pre_lock(0, &self.resource, &s.owner, s.leases.pre_lock, target_location, k);
        let out = self.lock_op(phase, "pre-lock", "201", c.until_known(&key, send)).await;
        if let Ok((r, ok)) = &out {
            // A token in a success answer is a live lock, even under an unexpected status:
            // holding it is what gets it released.
            if let Some(token) = granted(r) {
                self.hold(token);
                if check_replay {
                    self.replay_pre_lock(phase, &key, token, target_location).await;
                }
                return out;
            }
            if *ok {
                self.assert(
                    phase,
                    "pre-lock",
                    None,
                    "token",
                    "no token in lock view",
                    r.elapsed,
                    None,
                );
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
    /// (contract 1.0), which the report notes and the probe then lives with (a lock
    /// whose answer is lost is left to its lease); a different token is a second lock
    /// granted over the first, a failure, and that lock is released at once.
    async fn replay_pre_lock(&self, phase: &str, key: &CallKey, token: &str, target_location: Option<&str>) {
        let s = &self.sc.settings;
        let c = &self.sc.client;
        let send = |k| c.pre_lock(0, &self.resource, &s.owner, s.leases.pre_lock, target_location, k);
        let Ok(r) = c.until_known(key, send).await else { return };
        let observed = match granted(&r) {
            Some(again) if again == token => "same-token".to_string(),
            Some(_) => "fresh-lock".to_string(),
            None if r.outcome() == "423 lock-held" => {
                self.note(format!(
                    "{}: the service ignores Idempotency-Key (contract 1.0): a lock call whose answer is lost cannot be recovered, only left to its lease",
                    self.name
                ));
                return;
            }
            None => r.outcome(),
        };
        self.assert(phase, "pre-lock-replay", None, "same-token", &observed, r.elapsed, None);
        if observed == "fresh-lock" {
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
        let send = |k| c.release(0, &self.resource, token, k);
        if let Ok(r) = c.until_known(&CallKey::fresh(), send).await {
            if !matches!(r.status, 204 | 410) {
                tracing::warn!(resource = %self.resource, status = r.status, "could not release a lock granted in error");
            }
        }
    }

    pub(super) fn hold(&self, token: &str) {
        *lock(&self.token) = Some(token.to_string());
        if let Err(e) = self
            .sc
            .state
            .record_token(self.target(), &self.resource, token)
        {
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
        let started = Instant::now();
        let c = &self.sc.client;
        let send = |k| c.release(0, &self.resource, &token, k);
        match c.until_known(&CallKey::fresh(), send).await {
            Ok(r) => {
                // 410: the lease already ended, nothing is held any more.
                let observed = if matches!(r.status, 204 | 410) {
                    "released".to_string()
                } else {
                    r.outcome()
                };
                self.assert(
                    "cleanup", "release", None, "released", &observed, r.elapsed, None,
                );
                if matches!(r.status, 204 | 409 | 410) {
                    self.dropped();
                }
            }
            Err(e) => {
                // Keep the state entry: the next start retries the release.
                self.assert(
                    "cleanup",
                    "release",
                    None,
                    "released",
                    "unreachable",
                    started.elapsed(),
                    Some(e.to_string()),
                );
            }
        }
    }

    /// The convergence delay a lock view declares; `None` when it is missing or not a
    /// usable number of seconds.
    pub(super) fn declared(&self, r: &Reply) -> Option<Duration> {
        r.body
            .get("convergenceDelaySeconds")
            .and_then(Value::as_f64)
            .and_then(|d| Duration::try_from_secs_f64(d).ok())
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
        (declared.max(shown) + self.sc.settings.buffer).max(self.sc.settings.replication_bound)
    }
}
