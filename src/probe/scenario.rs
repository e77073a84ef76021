//! One probe cycle: the main migration walk (seed, pre-lock and convergence, hardDelete,
//! write lock, swap) on one test resource, and every negative check on its own resource.
//! Every check is an [`Assertion`]; a deviation fails that assertion and never panics the
//! probe; every path out of a check releases the lock it holds.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::observer::Observer;
use super::report::{Assertion, CycleReport, CycleResult, InstanceConvergence};
use super::settings::{ProbeSettings, RESOURCES_PER_CYCLE};
use super::state::StateFile;
use super::target::{Reply, TargetClient, TargetError};

/// Why a check stopped early.
#[derive(Debug)]
enum Abort {
    /// A lock operation did not give what the rest of the check needs (already asserted).
    Stop,
    /// The target could not be reached (already asserted).
    Transport(String),
    /// Timeout or shutdown.
    Cancelled,
}

/// Runs cycles against one target.
pub struct Scenario {
    settings: ProbeSettings,
    client: TargetClient,
    state: Arc<StateFile>,
    observer: Arc<dyn Observer>,
}

/// What a cycle collected while running, shared by its concurrent checks.
#[derive(Default)]
struct Recorder {
    assertions: Mutex<Vec<Assertion>>,
    read_through: Mutex<Vec<f64>>,
    phases: Mutex<Vec<(String, f64)>>,
    declared: Mutex<Option<f64>>,
    convergence: Mutex<Vec<InstanceConvergence>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Expected state of an item, updated only from outcomes the service reported.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Present(Value),
    Tombstone,
    Absent,
}

impl Scenario {
    /// A scenario for the target described by `settings`.
    pub fn new(
        settings: ProbeSettings,
        state: Arc<StateFile>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, TargetError> {
        let client = TargetClient::new(
            &settings.instances,
            &settings.api_key,
            &settings.test_prefix,
            settings.request_timeout,
        )?;
        Ok(Self {
            settings,
            client,
            state,
            observer,
        })
    }

    /// The target's settings.
    pub fn settings(&self) -> &ProbeSettings {
        &self.settings
    }

    /// Releases locks a previous run recorded for this target and did not release.
    /// Returns how many entries were cleared.
    pub async fn recover(&self) -> usize {
        self.recover_where(|_| true).await
    }

    /// Releases left-over locks on `resources` only (a cycle's own resources: other
    /// running cycles' entries must not be touched).
    async fn recover_resources(&self, resources: &[String]) -> usize {
        self.recover_where(|r| resources.iter().any(|x| x == r))
            .await
    }

    async fn recover_where(&self, wanted: impl Fn(&str) -> bool) -> usize {
        let mut cleared = 0;
        for held in self.state.entries() {
            if held.target != self.settings.name || !wanted(&held.resource) {
                continue;
            }
            let Some(token) = held.token.as_deref() else {
                // The service never answered that pre-lock (or we died first): without a
                // token nothing can be released; its lease ends it.
                tracing::warn!(target_name = %held.target, resource = %held.resource, "left-over pre-lock intent without token, lease will expire");
                let _ = self.state.forget(&held.target, &held.resource);
                cleared += 1;
                continue;
            };
            match self.client.release(0, &held.resource, token).await {
                Ok(r) if matches!(r.status, 204 | 404 | 409 | 410) => {
                    tracing::info!(target_name = %held.target, resource = %held.resource, status = r.status, "released lock left by a previous run");
                    if let Err(e) = self.state.forget(&held.target, &held.resource) {
                        tracing::warn!(error = %e, "cannot update state file");
                    }
                    cleared += 1;
                }
                Ok(r) => {
                    tracing::warn!(target_name = %held.target, resource = %held.resource, status = r.status, "could not release left-over lock");
                }
                Err(e) => {
                    tracing::warn!(target_name = %held.target, resource = %held.resource, error = %e, "could not release left-over lock");
                }
            }
        }
        cleared
    }

    /// Runs one full cycle on `resources` (the main resource first, then one per negative
    /// check; [`RESOURCES_PER_CYCLE`] in all). Never panics on a deviation: failures are in
    /// the report. `cancel` stops the cycle (timeout, shutdown); locks are still released.
    ///
    /// # Panics
    ///
    /// If fewer than [`RESOURCES_PER_CYCLE`] resources are given (a caller bug: the
    /// scheduler and `validate` always hand out that many).
    pub async fn run_cycle(&self, resources: &[String], cancel: CancellationToken) -> CycleReport {
        assert!(
            resources.len() >= RESOURCES_PER_CYCLE,
            "a cycle needs {RESOURCES_PER_CYCLE} resources"
        );
        let started_at = Utc::now();
        // A release that failed last time (target unreachable) is retried before reuse.
        self.recover_resources(resources).await;
        let rec = Recorder::default();
        let main = Check::new(self, &rec, "cycle", &resources[0]);
        let main_out = main.guarded(&cancel, main.walk()).await;

        let negatives = [
            ("negative/second-pre-lock", 1),
            ("negative/wrong-token", 2),
            ("negative/escalate-early", 3),
            ("negative/write-before-hard-delete", 4),
            ("negative/write-lease-lapse", 5),
            ("negative/concurrent-pre-locks", 6),
        ];
        let checks: Vec<Check<'_>> = negatives
            .iter()
            .map(|(name, i)| Check::new(self, &rec, name, &resources[*i]))
            .collect();
        let outs = if matches!(main_out, Err(Abort::Cancelled) | Err(Abort::Transport(_))) {
            Vec::new()
        } else {
            futures::future::join_all(checks.iter().map(|c| {
                let fut: std::pin::Pin<Box<dyn Future<Output = Result<(), Abort>> + Send + '_>> =
                    match c.name.as_str() {
                        "negative/second-pre-lock" => Box::pin(c.second_pre_lock()),
                        "negative/wrong-token" => Box::pin(c.wrong_token()),
                        "negative/escalate-early" => Box::pin(c.escalate_early()),
                        "negative/write-before-hard-delete" => {
                            Box::pin(c.write_before_hard_delete())
                        }
                        "negative/write-lease-lapse" => Box::pin(c.write_lease_lapse()),
                        _ => Box::pin(c.concurrent_pre_locks()),
                    };
                c.guarded(&cancel, fut)
            }))
            .await
        };

        let mut error = None;
        for out in std::iter::once(&main_out).chain(outs.iter()) {
            match out {
                Err(Abort::Transport(m)) => error = Some(format!("target unreachable: {m}")),
                Err(Abort::Cancelled) => {
                    error = Some("cycle cancelled (timeout or shutdown)".into())
                }
                _ => {}
            }
        }
        let assertions = std::mem::take(&mut *lock(&rec.assertions));
        let result = if error.is_some() {
            CycleResult::Error
        } else if assertions.iter().any(|a| !a.passed) {
            CycleResult::Failed
        } else {
            CycleResult::Passed
        };
        let report = CycleReport {
            target: self.settings.name.clone(),
            resource: resources[0].clone(),
            started_at,
            finished_at: Utc::now(),
            result,
            error,
            assertions,
            phase_durations: std::mem::take(&mut *lock(&rec.phases)),
            read_through_seconds: std::mem::take(&mut *lock(&rec.read_through)),
            declared_convergence_seconds: *lock(&rec.declared),
            expected_convergence_seconds: self
                .settings
                .expected_convergence
                .map(|d| d.as_secs_f64()),
            observed_convergence: std::mem::take(&mut *lock(&rec.convergence)),
        };
        self.observer.step(
            &self.settings.name,
            "cycle",
            &format!(
                "{} ({} assertions, {} failed, {} enforcement violations)",
                result.as_str(),
                report.assertions.len(),
                report.failed_assertions(),
                report.enforcement_violations()
            ),
        );
        report
    }
}

/// One check on one resource, with the lock it holds (if any).
struct Check<'a> {
    sc: &'a Scenario,
    rec: &'a Recorder,
    name: String,
    resource: String,
    token: Mutex<Option<String>>,
    items: Mutex<BTreeMap<String, Item>>,
}

/// Observed outcome of a user operation, in the vocabulary of the enforcement table.
fn classify(op: &str, r: &Reply) -> String {
    match (op, r.status) {
        (_, 423) if r.retry_after.is_some() => "block".into(),
        (_, 423) => "423 without Retry-After".into(),
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

impl<'a> Check<'a> {
    fn new(sc: &'a Scenario, rec: &'a Recorder, name: &str, resource: &str) -> Self {
        Self {
            sc,
            rec,
            name: name.to_string(),
            resource: resource.to_string(),
            token: Mutex::new(None),
            items: Mutex::new(BTreeMap::new()),
        }
    }

    fn target(&self) -> &str {
        &self.sc.settings.name
    }

    fn instances(&self) -> usize {
        self.sc.settings.instances.len()
    }

    fn step(&self, message: &str) {
        self.sc.observer.step(self.target(), &self.name, message);
    }

    /// Runs `body`, stopping it on cancellation, then releases whatever lock is still held.
    async fn guarded<F>(&self, cancel: &CancellationToken, body: F) -> Result<(), Abort>
    where
        F: Future<Output = Result<(), Abort>>,
    {
        let out = tokio::select! {
            out = body => out,
            _ = cancel.cancelled() => Err(Abort::Cancelled),
        };
        self.release_if_held().await;
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn assert(
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
    async fn call(
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
    async fn lock_op(
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

    /// A user operation on `instance` whose enforcement outcome must be `expected`.
    async fn user_op(
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

    async fn pre_lock(
        &self,
        phase: &str,
        target_location: Option<&str>,
    ) -> Result<(Reply, bool), Abort> {
        let s = &self.sc.settings;
        if let Err(e) = self.sc.state.record_intent(&s.name, &self.resource) {
            tracing::warn!(error = %e, "cannot record pre-lock intent in state file");
        }
        let out = self
            .lock_op(
                phase,
                "pre-lock",
                "201",
                self.sc.client.pre_lock(
                    0,
                    &self.resource,
                    &s.owner,
                    s.leases.pre_lock,
                    target_location,
                ),
            )
            .await;
        match &out {
            Ok((r, true)) => match r.str_field("token") {
                Some(token) => self.hold(token),
                None => {
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
            },
            _ => {
                let _ = self.sc.state.forget(&s.name, &self.resource);
            }
        }
        out
    }

    fn hold(&self, token: &str) {
        *lock(&self.token) = Some(token.to_string());
        if let Err(e) = self
            .sc
            .state
            .record_token(self.target(), &self.resource, token)
        {
            tracing::warn!(error = %e, "cannot record lock token in state file");
        }
    }

    fn token(&self) -> String {
        lock(&self.token).clone().unwrap_or_default()
    }

    fn dropped(&self) {
        *lock(&self.token) = None;
        if let Err(e) = self.sc.state.forget(self.target(), &self.resource) {
            tracing::warn!(error = %e, "cannot update state file");
        }
    }

    async fn release_if_held(&self) {
        let Some(token) = lock(&self.token).clone() else {
            return;
        };
        self.step("releasing the lock");
        let started = Instant::now();
        match self.sc.client.release(0, &self.resource, &token).await {
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

    fn declared(&self, r: &Reply) -> Duration {
        let secs = r
            .body
            .get("convergenceDelaySeconds")
            .and_then(Value::as_f64)
            .filter(|d| d.is_finite() && *d >= 0.0)
            .unwrap_or(0.0);
        Duration::from_secs_f64(secs)
    }

    /// How long to wait after a pre-lock before escalating: declared delay plus buffer,
    /// never less than the replication bound.
    fn escalation_wait(&self, declared: Duration) -> Duration {
        (declared + self.sc.settings.buffer).max(self.sc.settings.replication_bound)
    }

    /// The main migration walk on the cycle's resource.
    async fn walk(&self) -> Result<(), Abort> {
        let n = self.instances();
        let s = &self.sc.settings;
        let c = &self.sc.client;
        let res = self.resource.clone();

        self.step(&format!("seed: writing {} items to {res}", 3 * n));
        for i in 0..n {
            for kind in ["keep", "del", "wl"] {
                self.user_op("seed", "write", i, &format!("{kind}-{i}"), "allow")
                    .await?;
            }
        }
        self.step("seed: reading every item back on every instance");
        let keys: Vec<String> = lock(&self.items).keys().cloned().collect();
        for key in &keys {
            for j in 0..n {
                self.read_back("seed", j, key).await?;
            }
        }

        let route = self
            .call("seed", "route", Some(0), "200", c.route(0, &res))
            .await?;
        let current = route.str_field("location").unwrap_or_default().to_string();
        let to = if current == s.locations[0] {
            s.locations[1].clone()
        } else {
            s.locations[0].clone()
        };

        self.step(&format!(
            "pre-lock {res} (at {current:?}, migrating to {to:?})"
        ));
        let (r, ok) = self.pre_lock("preLock", Some(&to)).await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let t0 = Instant::now();
        let declared = self.declared(&r);
        *lock(&self.rec.declared) = Some(declared.as_secs_f64());
        if let Some(expected) = s.expected_convergence {
            let same = (declared.as_secs_f64() - expected.as_secs_f64()).abs() < 0.001;
            self.assert(
                "preLock",
                "declared-convergence",
                None,
                "as-configured",
                if same { "as-configured" } else { "mismatch" },
                Duration::ZERO,
                Some(format!(
                    "service declared {:.3}s, configured expectation {:.3}s",
                    declared.as_secs_f64(),
                    expected.as_secs_f64()
                )),
            );
        }
        let wait = self.escalation_wait(declared);

        self.step("pre-lock: nothing may be restricted yet");
        for i in 0..n {
            self.user_op("preLock", "read", i, &format!("keep-{i}"), "allow")
                .await?;
            self.user_op("preLock", "write", i, &format!("pl-{i}"), "allow")
                .await?;
            self.user_op("preLock", "delete", i, &format!("pl-{i}"), "allow")
                .await?;
        }

        self.step(&format!(
            "measuring convergence on {n} instances (declared {:.3}s, waiting {:.3}s)",
            declared.as_secs_f64(),
            wait.as_secs_f64()
        ));
        self.converge(t0, wait).await?;
        tokio::time::sleep_until((t0 + wait).into()).await;

        self.step("escalating to hardDelete");
        let (_, ok) = self
            .lock_op(
                "hardDelete",
                "escalate",
                "200",
                c.escalate(0, &res, &self.token(), "hardDelete", s.leases.hard_delete),
            )
            .await?;
        if !ok {
            return Err(Abort::Stop);
        }
        lock(&self.rec.phases).push(("preLock".into(), t0.elapsed().as_secs_f64()));
        let t1 = Instant::now();
        for i in 0..n {
            self.user_op("hardDelete", "read", i, &format!("keep-{i}"), "allow")
                .await?;
            self.user_op("hardDelete", "write", i, &format!("keep-{i}"), "allow")
                .await?;
            self.user_op("hardDelete", "delete", i, &format!("del-{i}"), "tombstone")
                .await?;
        }
        for i in 0..n {
            for j in 0..n {
                // The contract demands a tombstone here, whatever the delete answered.
                self.read_back_expecting("hardDelete", j, &format!("del-{i}"), "tombstone")
                    .await?;
            }
        }

        self.step("escalating to write");
        let (_, ok) = self
            .lock_op(
                "write",
                "escalate",
                "200",
                c.escalate(0, &res, &self.token(), "write", s.leases.write),
            )
            .await?;
        if !ok {
            return Err(Abort::Stop);
        }
        lock(&self.rec.phases).push(("hardDelete".into(), t1.elapsed().as_secs_f64()));
        let t2 = Instant::now();
        for i in 0..n {
            self.user_op("write", "read", i, &format!("keep-{i}"), "allow")
                .await?;
            self.user_op("write", "write", i, &format!("wl-{i}"), "block")
                .await?;
            self.user_op("write", "delete", i, &format!("wl-{i}"), "block")
                .await?;
        }

        self.step(&format!("swapping {res} to {to:?}"));
        let (r, ok) = self
            .lock_op("swap", "swap", "200", c.swap(0, &res, &self.token(), &to))
            .await?;
        if !ok {
            return Err(Abort::Stop);
        }
        lock(&self.rec.phases).push(("write".into(), t2.elapsed().as_secs_f64()));
        self.dropped();
        self.assert(
            "swap",
            "swap-view",
            None,
            "moved-unlocked",
            &route_summary(&r, &to),
            Duration::ZERO,
            Some(format!(
                "location {:?}",
                r.str_field("location").unwrap_or_default()
            )),
        );
        for i in 0..n {
            let r = self
                .call("swap", "route", Some(i), "moved-unlocked", c.route(i, &res))
                .await?;
            self.assert(
                "swap",
                "route",
                Some(i),
                "moved-unlocked",
                &route_summary(&r, &to),
                r.elapsed,
                None,
            );
            self.user_op("swap", "read", i, &format!("keep-{i}"), "allow")
                .await?;
            self.user_op("swap", "write", i, &format!("post-{i}"), "allow")
                .await?;
            self.user_op("swap", "delete", i, &format!("post-{i}"), "allow")
                .await?;
        }

        self.step(&format!("checking every item at {to:?}"));
        let model: Vec<(String, Item)> = lock(&self.items).clone().into_iter().collect();
        for (key, item) in model {
            let r = self
                .call("swap", "items", Some(0), "present", c.read(0, &res, &key))
                .await?;
            let (expected, observed) = match &item {
                Item::Present(v) => (
                    "present",
                    match (r.status, r.body.get("tombstone"), r.body.get("value")) {
                        (200, Some(Value::Bool(true)), _) => "tombstone".to_string(),
                        (200, _, Some(got)) if got == v => "present".to_string(),
                        (200, _, _) => "wrong-value".to_string(),
                        (404, _, _) => "absent".to_string(),
                        _ => r.outcome(),
                    },
                ),
                Item::Tombstone | Item::Absent => (
                    "not-resurrected",
                    match (r.status, r.body.get("tombstone")) {
                        (200, Some(Value::Bool(true))) | (404, _) => "not-resurrected".to_string(),
                        (200, _) => "resurrected".to_string(),
                        _ => r.outcome(),
                    },
                ),
            };
            self.assert(
                "swap",
                "items",
                Some(0),
                expected,
                &observed,
                r.elapsed,
                Some(format!("item {key}")),
            );
        }
        Ok(())
    }

    /// Reads `key` on `instance` and compares it with the model.
    async fn read_back(&self, phase: &str, instance: usize, key: &str) -> Result<(), Abort> {
        let expected = match lock(&self.items).get(key) {
            Some(Item::Present(_)) => "allow",
            Some(Item::Tombstone) => "tombstone",
            _ => "absent",
        };
        self.read_back_expecting(phase, instance, key, expected)
            .await
    }

    /// Reads `key` on `instance`; `expected` is what the lock phase demands, which may
    /// differ from the model when the service misbehaved.
    async fn read_back_expecting(
        &self,
        phase: &str,
        instance: usize,
        key: &str,
        expected: &str,
    ) -> Result<(), Abort> {
        let item = lock(&self.items).get(key).cloned();
        let c = &self.sc.client;
        let r = self
            .call(
                phase,
                "read-back",
                Some(instance),
                expected,
                c.read(instance, &self.resource, key),
            )
            .await?;
        let mut observed = classify("read", &r);
        if let (Some(Item::Present(v)), "allow") = (&item, observed.as_str()) {
            if r.body.get("value") != Some(v) {
                observed = "wrong-value".into();
            }
        }
        self.assert(
            phase,
            "read-back",
            Some(instance),
            expected,
            &observed,
            r.elapsed,
            Some(format!("item {key}")),
        );
        Ok(())
    }

    /// Polls the route view of every instance until it shows the lock or `wait` has passed
    /// since `t0`; records the observed convergence and one assertion per instance.
    async fn converge(&self, t0: Instant, wait: Duration) -> Result<(), Abort> {
        let c = &self.sc.client;
        let deadline = t0 + wait;
        let poll = self.sc.settings.poll_interval;
        let per_instance = (0..self.instances()).map(|i| async move {
            loop {
                let r = self
                    .call(
                        "preLock",
                        "converge",
                        Some(i),
                        "lock-visible",
                        c.route(i, &self.resource),
                    )
                    .await?;
                let seen = r.body.get("lock").is_some_and(|l| l.is_object());
                if seen {
                    return Ok::<_, Abort>(Some(t0.elapsed()));
                }
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                let next = (Instant::now() + poll).min(deadline);
                tokio::time::sleep_until(next.into()).await;
            }
        });
        let seen = futures::future::try_join_all(per_instance).await?;
        for (i, observed) in seen.into_iter().enumerate() {
            let url = self.sc.settings.instances[i].clone();
            lock(&self.rec.convergence).push(InstanceConvergence {
                instance: url,
                observed_seconds: observed.map(|d| d.as_secs_f64()),
            });
            let (obs, detail) = match observed {
                Some(d) => ("lock-visible", format!("visible after {:.3}s (bound {:.3}s)", d.as_secs_f64(), wait.as_secs_f64())),
                None => (
                    "not-visible",
                    format!(
                        "convergence violation: lock not visible after {:.3}s (declared delay + buffer)",
                        wait.as_secs_f64()
                    ),
                ),
            };
            self.assert(
                "preLock",
                "converge",
                Some(i),
                "lock-visible",
                obs,
                observed.unwrap_or(wait),
                Some(detail),
            );
        }
        Ok(())
    }

    /// Pre-locks and waits until the lock is effective everywhere.
    async fn pre_lock_and_wait(&self) -> Result<(), Abort> {
        let (r, ok) = self.pre_lock("preLock", None).await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let wait = self.escalation_wait(self.declared(&r));
        self.step(&format!(
            "waiting {:.3}s for the pre-lock to take effect",
            wait.as_secs_f64()
        ));
        tokio::time::sleep(wait).await;
        Ok(())
    }

    async fn second_pre_lock(&self) -> Result<(), Abort> {
        self.step(&format!(
            "a second pre-lock on {} must be refused",
            self.resource
        ));
        let (_, ok) = self.pre_lock("preLock", None).await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let s = &self.sc.settings;
        self.lock_op(
            "preLock",
            "pre-lock-again",
            "423 lock-held",
            self.sc
                .client
                .pre_lock(0, &self.resource, &s.owner, s.leases.pre_lock, None),
        )
        .await?;
        Ok(())
    }

    async fn wrong_token(&self) -> Result<(), Abort> {
        self.step(&format!(
            "a wrong token on {} must be refused",
            self.resource
        ));
        let (_, ok) = self.pre_lock("preLock", None).await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let wrong = hex::encode(rand::random::<[u8; 16]>());
        let c = &self.sc.client;
        self.lock_op(
            "preLock",
            "renew",
            "409 token-mismatch",
            c.renew(0, &self.resource, &wrong, self.sc.settings.leases.pre_lock),
        )
        .await?;
        self.lock_op(
            "preLock",
            "release",
            "409 token-mismatch",
            c.release(0, &self.resource, &wrong),
        )
        .await?;
        Ok(())
    }

    async fn escalate_early(&self) -> Result<(), Abort> {
        self.step(&format!(
            "escalating {} before effectiveAt must be refused",
            self.resource
        ));
        let (_, ok) = self.pre_lock("preLock", None).await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let s = &self.sc.settings;
        self.lock_op(
            "preLock",
            "escalate-early",
            "409 invalid-transition",
            self.sc.client.escalate(
                0,
                &self.resource,
                &self.token(),
                "hardDelete",
                s.leases.hard_delete,
            ),
        )
        .await?;
        Ok(())
    }

    async fn write_before_hard_delete(&self) -> Result<(), Abort> {
        self.step(&format!(
            "escalating {} to write before hardDelete must be refused",
            self.resource
        ));
        self.pre_lock_and_wait().await?;
        let s = &self.sc.settings;
        self.lock_op(
            "preLock",
            "escalate-write",
            "409 invalid-transition",
            self.sc
                .client
                .escalate(0, &self.resource, &self.token(), "write", s.leases.write),
        )
        .await?;
        Ok(())
    }

    async fn write_lease_lapse(&self) -> Result<(), Abort> {
        self.step(&format!(
            "a short write lease on {} must lapse by itself",
            self.resource
        ));
        self.pre_lock_and_wait().await?;
        let s = &self.sc.settings;
        let c = &self.sc.client;
        let (_, ok) = self
            .lock_op(
                "hardDelete",
                "escalate",
                "200",
                c.escalate(
                    0,
                    &self.resource,
                    &self.token(),
                    "hardDelete",
                    s.leases.hard_delete,
                ),
            )
            .await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let (_, ok) = self
            .lock_op(
                "write",
                "escalate",
                "200",
                c.escalate(
                    0,
                    &self.resource,
                    &self.token(),
                    "write",
                    s.leases.short_write,
                ),
            )
            .await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let lapse = s.leases.short_write + s.buffer.max(Duration::from_millis(200));
        self.step(&format!(
            "waiting {:.3}s for the write lease to lapse",
            lapse.as_secs_f64()
        ));
        tokio::time::sleep(lapse).await;
        self.user_op("write", "write", 0, "after-lapse", "allow")
            .await?;
        // Swap towards the other location, so only the lapsed lease can be the refusal.
        let route = self
            .call("write", "route", Some(0), "200", c.route(0, &self.resource))
            .await?;
        let to = if route.str_field("location") == Some(s.locations[0].as_str()) {
            &s.locations[1]
        } else {
            &s.locations[0]
        };
        let (r, _) = self
            .lock_op(
                "write",
                "swap-after-lapse",
                "410 lock-expired",
                c.swap(0, &self.resource, &self.token(), to),
            )
            .await?;
        if r.status == 200 {
            // The service swapped on a dead token: nothing is held any more.
            self.dropped();
        }
        Ok(())
    }

    async fn concurrent_pre_locks(&self) -> Result<(), Abort> {
        let s = &self.sc.settings;
        let n = s.concurrent_pre_locks;
        self.step(&format!(
            "{n} concurrent pre-locks on {} must give exactly one winner",
            self.resource
        ));
        if let Err(e) = self.sc.state.record_intent(&s.name, &self.resource) {
            tracing::warn!(error = %e, "cannot record pre-lock intent in state file");
        }
        let started = Instant::now();
        let replies = futures::future::join_all((0..n).map(|k| {
            let owner = format!("{}#{k}", s.owner);
            let inst = k % self.instances();
            async move {
                self.sc
                    .client
                    .pre_lock(inst, &self.resource, &owner, s.leases.pre_lock, None)
                    .await
            }
        }))
        .await;
        let mut winners = Vec::new();
        let mut losers_ok = 0;
        let mut others = Vec::new();
        for r in replies {
            match r {
                Ok(r) if r.status == 201 => {
                    winners.push(r.str_field("token").unwrap_or_default().to_string())
                }
                Ok(r) if r.outcome() == "423 lock-held" => losers_ok += 1,
                Ok(r) => others.push(r.outcome()),
                Err(e) => others.push(e.to_string()),
            }
        }
        let observed = format!("{} winner(s)", winners.len());
        self.assert(
            "preLock",
            "pre-lock-race",
            None,
            "1 winner(s)",
            &observed,
            started.elapsed(),
            Some(format!(
                "{losers_ok} refused with 423 lock-held, other outcomes: {others:?}"
            )),
        );
        self.assert(
            "preLock",
            "pre-lock-race-losers",
            None,
            "423 lock-held",
            if losers_ok + winners.len() == n {
                "423 lock-held"
            } else {
                "other outcome"
            },
            started.elapsed(),
            None,
        );
        let mut winners = winners.into_iter();
        match winners.next() {
            Some(first) => self.hold(&first),
            None => {
                let _ = self.sc.state.forget(&s.name, &self.resource);
            }
        }
        // More than one winner is a bug in the service; do not leave its extra locks behind.
        for extra in winners {
            let _ = self.sc.client.release(0, &self.resource, &extra).await;
        }
        Ok(())
    }
}

/// `moved-unlocked` when a route view shows `to` and no lock, else what it does show.
fn route_summary(r: &Reply, to: &str) -> String {
    if r.status != 200 {
        return r.outcome();
    }
    let at = r.str_field("location").unwrap_or_default();
    let locked = r.body.get("lock").is_some_and(|l| !l.is_null());
    match (at == to, locked) {
        (true, false) => "moved-unlocked".into(),
        (true, true) => "moved-still-locked".into(),
        (false, _) => "not-moved".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: Value, retry_after: Option<&str>) -> Reply {
        Reply {
            status,
            problem: (status >= 400).then(|| {
                body["type"]
                    .as_str()
                    .unwrap_or("x")
                    .trim_start_matches("urn:lockprobe:error:")
                    .to_string()
            }),
            body,
            retry_after: retry_after.map(str::to_string),
            timing: None,
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn classify_follows_the_enforcement_table() {
        assert_eq!(
            classify("read", &reply(200, json!({"tombstone": false}), None)),
            "allow"
        );
        assert_eq!(
            classify("read", &reply(200, json!({"tombstone": true}), None)),
            "tombstone"
        );
        assert_eq!(classify("read", &reply(404, json!({}), None)), "absent");
        assert_eq!(classify("write", &reply(201, json!({}), None)), "allow");
        assert_eq!(
            classify(
                "write",
                &reply(
                    423,
                    json!({"type": "urn:lockprobe:error:lock-held"}),
                    Some("5")
                )
            ),
            "block"
        );
        assert_eq!(
            classify(
                "write",
                &reply(423, json!({"type": "urn:lockprobe:error:lock-held"}), None)
            ),
            "423 without Retry-After"
        );
        assert_eq!(classify("delete", &reply(204, Value::Null, None)), "allow");
        assert_eq!(
            classify("delete", &reply(202, json!({"tombstone": true}), None)),
            "tombstone"
        );
        assert_eq!(
            classify(
                "delete",
                &reply(
                    500,
                    json!({"type": "urn:lockprobe:error:store-unavailable"}),
                    None
                )
            ),
            "500 store-unavailable"
        );
    }

    #[test]
    fn route_summary_distinguishes_outcomes() {
        assert_eq!(
            route_summary(
                &reply(200, json!({"location": "b", "lock": null}), None),
                "b"
            ),
            "moved-unlocked"
        );
        assert_eq!(
            route_summary(
                &reply(200, json!({"location": "a", "lock": null}), None),
                "b"
            ),
            "not-moved"
        );
        assert_eq!(
            route_summary(
                &reply(
                    200,
                    json!({"location": "b", "lock": {"phase": "write"}}),
                    None
                ),
                "b"
            ),
            "moved-still-locked"
        );
    }
}
