//! The main migration walk of a cycle: seed, pre-lock and convergence, hardDelete,
//! write lock, swap, and the item check at the new location.

use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use serde_json::Value;

use super::check::{classify, granted, seconds_between, Check, LockTimes, ServiceInstant};
use super::{lock, Abort, Item};
use crate::probe::checks::report::InstanceConvergence;
use crate::probe::checks::settings::{CONVERGENCE_TOLERANCE_CONSTANT, PRIMING_LIMIT};
use crate::probe::checks::target::{CallKey, Reply};
use crate::probe::checks::vocabulary::{Op, Outcome, Phase, UserOp};

impl Check<'_> {
    /// The main migration walk on the cycle's resource: each step stands on the one
    /// before it, and the walk stops at the first that does not give what the next needs.
    pub(super) async fn walk(&self) -> Result<(), Abort> {
        let to = self.seed().await?;
        let pre_locked = self.pre_lock_and_converge(&to).await?;
        let maximum = lock(&self.last_view).and_then(|t| t.maximum());
        self.renew_extends(Phase::PreLock, self.sc.settings.leases.pre_lock).await?;
        let hard_delete = self.hard_delete_phase(pre_locked).await?;
        let write = self.write_phase(hard_delete).await?;
        self.renew_past_the_pre_lock().await?;
        self.swap_and_check(&to, write).await?;
        match maximum {
            Some(maximum) => self.pre_lock_over_maximum(maximum).await,
            None => Ok(()),
        }
    }

    /// Writes three items through every instance and reads each back on every instance;
    /// returns the location the resource migrates to (the one it is not at).
    async fn seed(&self) -> Result<String, Abort> {
        let n = self.instances();
        let s = &self.sc.settings;
        self.mark(Phase::Seed);
        self.step(&format!("seed: writing {} items to {}", 3 * n, self.resource));
        for i in 0..n {
            for kind in ["keep", "del", "wl"] {
                self.user_op(Phase::Seed, UserOp::Write, i, &format!("{kind}-{i}"), Outcome::Allow).await?;
            }
        }
        self.step("seed: reading every item back on every instance");
        let keys: Vec<String> = lock(&self.items).keys().cloned().collect();
        for key in &keys {
            for j in 0..n {
                self.read_back(Phase::Seed, j, key).await?;
            }
        }
        let route = self
            .expect(Phase::Seed, Op::Route, Outcome::ok())
            .on(0)
            .call(self.sc.client.route(0, &self.resource))
            .await?;
        let current = route.str_field("location").unwrap_or_default();
        let to = if current == s.locations[0] { &s.locations[1] } else { &s.locations[0] };
        self.step(&format!("pre-lock {} (at {current:?}, migrating to {to:?})", self.resource));
        Ok(to.clone())
    }

    /// Takes the pre-lock towards `to`, judges the declared convergence delay, measures
    /// convergence on every instance while checking nothing is restricted yet, and waits
    /// until escalation is safe; returns when the pre-lock was granted.
    async fn pre_lock_and_converge(&self, to: &str) -> Result<ServiceInstant, Abort> {
        let (r, ok) = self.pre_lock_primed(Phase::PreLock, Some(to), true, true).await?;
        if !ok {
            return Err(Abort::Stop);
        }
        // From the pre-lock's answer, not after its replay: the declaration counts from it.
        let (t0, answered) = lock(&self.pre_lock_answered).unwrap_or((Instant::now(), Utc::now()));
        self.mark_at(Phase::PreLock, answered);
        let began = match LockTimes::of(&r.body) {
            Ok(t) => ServiceInstant { at: t.acquired_at, offset: t.acquired_at - answered },
            Err(_) => ServiceInstant { at: answered, offset: TimeDelta::zero() },
        };
        let declared = self.judge_declared(&r)?;
        let wait = self.escalation_wait(&r, declared);
        *lock(&self.rec.escalation_wait) = Some(wait.as_secs_f64());
        self.step(&format!(
            "measuring convergence on {} instances (declared {:.3}s, waiting {:.3}s) while checking nothing is restricted yet",
            self.instances(),
            declared.as_secs_f64(),
            wait.as_secs_f64()
        ));
        // Side by side: convergence is timed from the pre-lock, so the user operations
        // must not run first and add their own latency to it.
        let unrestricted = self.on_every_instance(
            Phase::PreLock,
            [
                (UserOp::Read, "keep", Outcome::Allow),
                (UserOp::Write, "pl", Outcome::Allow),
                (UserOp::Delete, "pl", Outcome::Allow),
            ],
        );
        futures::future::try_join(self.converge(t0, declared, wait), unrestricted).await?;
        tokio::time::sleep_until((t0 + wait).into()).await;
        Ok(began)
    }

    /// Polls the route of the instances the pre-lock will not go to until one of them
    /// answers from a fresh fetch (`source` other than `cache`), for at most
    /// [`PRIMING_LIMIT`], and returns at once: that instance then holds a copy fetched
    /// just before the lock exists, so its convergence is close to the worst case the
    /// declared delay must cover (the copy lives one cache TTL, and the replica read
    /// after it may lag by the replication bound). Without this an instance whose copy
    /// was about to expire anyway converges early, and an under-declaration goes
    /// unnoticed.
    pub(super) async fn prime_caches(&self, lock_call_instance: usize) -> Result<(), Abort> {
        let c = &self.sc.client;
        let poll = self.sc.settings.poll_interval;
        let until = Instant::now() + PRIMING_LIMIT;
        let others: Vec<usize> = (0..self.instances()).filter(|i| *i != lock_call_instance).collect();
        if others.is_empty() {
            return Ok(());
        }
        let fresh = |i: usize| async move {
            loop {
                let r =
                    self.expect(Phase::Seed, Op::Route, Outcome::ok()).on(i).call(c.route(i, &self.resource)).await?;
                if r.str_field("source") != Some("cache") || Instant::now() + poll >= until {
                    return Ok::<_, Abort>(());
                }
                tokio::time::sleep(poll).await;
            }
        };
        futures::future::select_ok(others.into_iter().map(|i| Box::pin(fresh(i)))).await?;
        Ok(())
    }

    /// Renews the held lock (in `phase`) for `lease`: the lease must end later than
    /// before, or already end at the maximum; the lock view must be consistent.
    async fn renew_extends(&self, phase: Phase, lease: Duration) -> Result<Option<LockTimes>, Abort> {
        let before = *lock(&self.last_view);
        let c = &self.sc.client;
        let token = self.token();
        let at = self.lock_instance();
        self.step(&format!("renewing the {phase} lease for {:.3}s", lease.as_secs_f64()));
        let send = |k| c.renew(at, &self.resource, &token, lease, k);
        let r = self
            .expect(phase, Op::Renew, Outcome::ok())
            .on(at)
            .must_lock_op(c.until_known(&CallKey::fresh(), send))
            .await?;
        let after = self.check_lock_view(phase, &r);
        if let (Some(before), Some(after)) = (before, after) {
            let (observed, why) = if after.expires_at > before.expires_at {
                (Outcome::Extended, "later")
            } else if after.expires_at == after.max_expires_at {
                (Outcome::Extended, "already at maxExpiresAt")
            } else {
                (Outcome::NotExtended, "not later")
            };
            self.expect(phase, Op::RenewExtends, Outcome::Extended)
                .detail(format!(
                    "expiresAt {} -> {} ({why})",
                    before.expires_at.to_rfc3339(),
                    after.expires_at.to_rfc3339()
                ))
                .observed(observed, r.elapsed);
        }
        Ok(after)
    }

    /// Renews the write lease past the end of the pre-lock: it must be extended and end
    /// exactly with the pre-lock (or the maximum), never after it.
    async fn renew_past_the_pre_lock(&self) -> Result<(), Abort> {
        let Some(before) = *lock(&self.last_view) else { return Ok(()) };
        let until_parent = (before.pre_lock_expires_at - Utc::now()).to_std().unwrap_or_default();
        let lease = until_parent + self.sc.settings.leases.write;
        let Some(after) = self.renew_extends(Phase::Write, lease).await? else { return Ok(()) };
        let parent = after.pre_lock_expires_at.min(after.max_expires_at);
        let slack = TimeDelta::milliseconds(1);
        let observed = if after.expires_at > parent + slack {
            Outcome::OutlivesParent
        } else if after.expires_at < parent - slack {
            Outcome::ShortOfParent
        } else {
            Outcome::CappedAtParent
        };
        self.expect(Phase::Write, Op::RenewCapped, Outcome::CappedAtParent)
            .detail(format!(
                "asked for {:.0}s; expiresAt {}, preLockExpiresAt {}, maxExpiresAt {}",
                lease.as_secs_f64(),
                after.expires_at.to_rfc3339(),
                after.pre_lock_expires_at.to_rfc3339(),
                after.max_expires_at.to_rfc3339()
            ))
            .observed(observed, Duration::ZERO);
        Ok(())
    }

    /// After the swap (nothing held), a pre-lock a minute longer than the maximum the
    /// service's lock views showed must be refused as a bad request; one granted in
    /// error is released at once.
    async fn pre_lock_over_maximum(&self, maximum: Duration) -> Result<(), Abort> {
        let s = &self.sc.settings;
        let c = &self.sc.client;
        let lease = maximum + Duration::from_secs(60);
        self.step(&format!("a pre-lock of {:.0}s (over the maximum) must be refused", lease.as_secs_f64()));
        let at = self.lock_instance();
        let send = |k| c.pre_lock(at, &self.resource, &s.owner, lease, None, k);
        let (r, _) = self
            .expect(Phase::Swap, Op::PreLockOverMax, Outcome::bad_request())
            .on(at)
            .detail(format!("maxExpiresAt - acquiredAt is {:.0}s", maximum.as_secs_f64()))
            .lock_op(c.until_known(&CallKey::fresh(), send))
            .await?;
        if granted(&r).is_some() {
            self.release_unexpected(&r).await;
        }
        Ok(())
    }

    /// The convergence delay the pre-lock's answer `r` declares, checked against the
    /// configured expectation. Without a declared delay there is no safe time to
    /// escalate: the walk stops (and releases) rather than guess.
    fn judge_declared(&self, r: &Reply) -> Result<Duration, Abort> {
        let Some(declared) = self.declared(r) else {
            self.expect(Phase::PreLock, Op::ConvergenceDelay, Outcome::Declared)
                .detail("no usable convergenceDelaySeconds in the lock view")
                .observed(Outcome::Missing, r.elapsed);
            return Err(Abort::Stop);
        };
        *lock(&self.rec.declared) = Some(declared.as_secs_f64());
        if let Some(expected) = self.sc.settings.expected_convergence {
            let same = (declared.as_secs_f64() - expected.as_secs_f64()).abs() < 0.001;
            self.expect(Phase::PreLock, Op::DeclaredConvergence, Outcome::AsConfigured)
                .detail(format!(
                    "service declared {:.3}s, configured expectation {:.3}s",
                    declared.as_secs_f64(),
                    expected.as_secs_f64()
                ))
                .observed(if same { Outcome::AsConfigured } else { Outcome::Mismatch }, Duration::ZERO);
        }
        Ok(declared)
    }

    /// Escalates to hardDelete (the pre-lock held since `pre_locked`): reads and writes
    /// allowed, deletes tombstoned and read back as tombstones everywhere.
    async fn hard_delete_phase(&self, pre_locked: ServiceInstant) -> Result<ServiceInstant, Abort> {
        let n = self.instances();
        let lease = self.sc.settings.leases.hard_delete;
        let since = self.escalate_after(Phase::PreLock, pre_locked, Phase::HardDelete, lease).await?;
        self.on_every_instance(
            Phase::HardDelete,
            [
                (UserOp::Read, "keep", Outcome::Allow),
                (UserOp::Write, "keep", Outcome::Allow),
                (UserOp::Delete, "del", Outcome::Tombstone),
            ],
        )
        .await?;
        for i in 0..n {
            for j in 0..n {
                // The contract demands a tombstone here, whatever the delete answered.
                self.read_back_expecting(Phase::HardDelete, j, &format!("del-{i}"), Outcome::Tombstone).await?;
            }
        }
        Ok(since)
    }

    /// Escalates to write (hardDelete held since `hard_deleted`): reads allowed, writes
    /// and deletes blocked.
    async fn write_phase(&self, hard_deleted: ServiceInstant) -> Result<ServiceInstant, Abort> {
        let lease = self.sc.settings.leases.write;
        let since = self.escalate_after(Phase::HardDelete, hard_deleted, Phase::Write, lease).await?;
        for i in 0..self.instances() {
            let r = self.user_op(Phase::Write, UserOp::Read, i, &format!("keep-{i}"), Outcome::Allow).await?;
            self.read_through(i, &r);
            self.user_op(Phase::Write, UserOp::Write, i, &format!("wl-{i}"), Outcome::Block).await?;
            self.user_op(Phase::Write, UserOp::Delete, i, &format!("wl-{i}"), Outcome::Block).await?;
        }
        Ok(since)
    }

    /// A read on `instance` in the write phase must have gone through the write region
    /// (`Server-Timing: route;desc="read-through"`): a cached copy may predate the lock.
    /// Records the store time the service reported and the probe's own measurement.
    pub(super) fn read_through(&self, instance: usize, r: &Reply) {
        let observed = match &r.timing {
            Some(t) if t.source == "read-through" => {
                lock(&self.rec.read_through).push(t.duration.as_secs_f64());
                lock(&self.rec.read_through_client).push(r.elapsed.as_secs_f64());
                Outcome::ReadThrough
            }
            Some(t) => Outcome::Other(format!("via {}", t.source)),
            None => Outcome::NoServerTiming,
        };
        let detail = match &r.timing {
            Some(t) => format!(
                "store {:.3}ms, measured {:.3}ms",
                t.duration.as_secs_f64() * 1e3,
                r.elapsed.as_secs_f64() * 1e3
            ),
            None => format!("measured {:.3}ms", r.elapsed.as_secs_f64() * 1e3),
        };
        self.expect(Phase::Write, Op::ReadThrough, Outcome::ReadThrough)
            .on(instance)
            .detail(detail)
            .observed(observed, r.elapsed);
    }

    /// Swaps to `to` (the write lock held since `write_locked`): every route view shows
    /// the new location and no lock, user operations are allowed, and every item is at
    /// the new location as last written, none resurrected.
    async fn swap_and_check(&self, to: &str, write_locked: ServiceInstant) -> Result<(), Abort> {
        let n = self.instances();
        let c = &self.sc.client;
        let res = &self.resource;
        self.step(&format!("swapping {res} to {to:?}"));
        let token = self.token();
        let at = self.lock_instance();
        let send = |k| c.swap(at, res, &token, to, k);
        let (out, midpoint) = self.timed(c.until_known(&CallKey::fresh(), send)).await;
        let r = self.expect(Phase::Swap, Op::Swap, Outcome::ok()).on(at).must_lock_op(async { out }).await?;
        self.mark(Phase::Swap);
        // A route view carries no timestamp: the swap's instant by the service's clock is
        // the call's midpoint moved by the offset learnt from the write escalation.
        let swapped = midpoint + write_locked.offset;
        lock(&self.rec.phases).push((Phase::Write, seconds_between(write_locked.at, swapped)));
        self.dropped();
        self.expect(Phase::Swap, Op::SwapView, Outcome::MovedUnlocked)
            .detail(format!("location {:?}", r.str_field("location").unwrap_or_default()))
            .observed(route_summary(&r, to), Duration::ZERO);
        for i in 0..n {
            let expect = self.expect(Phase::Swap, Op::Route, Outcome::MovedUnlocked).on(i);
            let r = expect.call(c.route(i, res)).await?;
            expect.observed(route_summary(&r, to), r.elapsed);
        }
        self.on_every_instance(
            Phase::Swap,
            [
                (UserOp::Read, "keep", Outcome::Allow),
                (UserOp::Write, "post", Outcome::Allow),
                (UserOp::Delete, "post", Outcome::Allow),
            ],
        )
        .await?;

        self.step(&format!("checking every item at {to:?} on every instance"));
        let model: Vec<(String, Item)> = lock(&self.items).clone().into_iter().collect();
        for (key, item) in model {
            for i in 0..n {
                self.item_after_swap(i, &key, &item).await?;
            }
        }
        Ok(())
    }

    /// Reads `key` on `instance` after the swap: what was written is there with its value,
    /// what was deleted or tombstoned has not come back.
    pub(super) async fn item_after_swap(&self, instance: usize, key: &str, item: &Item) -> Result<(), Abort> {
        let expected = match item {
            Item::Present(_) => Outcome::Present,
            Item::Tombstone | Item::Absent => Outcome::NotResurrected,
        };
        let expect = self.expect(Phase::Swap, Op::Items, expected).on(instance).detail(format!("item {key}"));
        let r = expect.call(self.sc.client.read(instance, &self.resource, key)).await?;
        let observed = match item {
            Item::Present(v) => match (r.status, r.body.get("tombstone"), r.body.get("value")) {
                (200, Some(Value::Bool(true)), _) => Outcome::Tombstone,
                (200, _, Some(got)) if got == v => Outcome::Present,
                (200, _, _) => Outcome::WrongValue,
                (404, _, _) => Outcome::Absent,
                _ => r.outcome(),
            },
            Item::Tombstone | Item::Absent => match (r.status, r.body.get("tombstone")) {
                (200, Some(Value::Bool(true))) | (404, _) => Outcome::NotResurrected,
                (200, _) => Outcome::Resurrected,
                _ => r.outcome(),
            },
        };
        expect.observed(observed, r.elapsed);
        Ok(())
    }

    /// Reads `key` on `instance` and compares it with the model.
    pub(super) async fn read_back(&self, phase: Phase, instance: usize, key: &str) -> Result<(), Abort> {
        let expected = match lock(&self.items).get(key) {
            Some(Item::Present(_)) => Outcome::Allow,
            Some(Item::Tombstone) => Outcome::Tombstone,
            _ => Outcome::Absent,
        };
        self.read_back_expecting(phase, instance, key, expected).await
    }

    /// Reads `key` on `instance`; `expected` is what the lock phase demands, which may
    /// differ from the model when the service misbehaved.
    pub(super) async fn read_back_expecting(
        &self,
        phase: Phase,
        instance: usize,
        key: &str,
        expected: Outcome,
    ) -> Result<(), Abort> {
        let item = lock(&self.items).get(key).cloned();
        let expect = self.expect(phase, Op::ReadBack, expected).on(instance).detail(format!("item {key}"));
        let r = expect.call(self.sc.client.read(instance, &self.resource, key)).await?;
        let mut observed = classify(UserOp::Read, &r);
        if let (Some(Item::Present(v)), Outcome::Allow) = (&item, &observed) {
            if r.body.get("value") != Some(v) {
                observed = Outcome::WrongValue;
            }
        }
        expect.observed(observed, r.elapsed);
        Ok(())
    }

    /// Polls the route view of every instance until it shows the lock, for `wait` since
    /// `t0` (the pre-lock's answer) and at least until the declared delay + the
    /// measurement tolerance; records the observed convergence and, per instance, two
    /// assertions: visible within `wait` (`preLock/converge`), and visible within the
    /// declared delay + tolerance (`preLock/convergence-declared`), which no buffer
    /// excuses.
    pub(super) async fn converge(&self, t0: Instant, declared: Duration, wait: Duration) -> Result<(), Abort> {
        let per_instance = (0..self.instances()).map(|i| self.watch(i, t0, declared, wait));
        let watched = futures::future::try_join_all(per_instance).await?;
        for (i, w) in watched.into_iter().enumerate() {
            self.judge_convergence(i, w, declared, wait);
        }
        Ok(())
    }

    /// Polls the route of `instance` until it shows the lock, or until both `wait` and
    /// the declared delay + the tolerance constant + one poll interval have passed since
    /// `t0` (so that a poll is sent after the declared delay + the constant).
    async fn watch(&self, instance: usize, t0: Instant, declared: Duration, wait: Duration) -> Result<Watched, Abort> {
        let c = &self.sc.client;
        let poll = self.sc.settings.poll_interval;
        let expect = self.expect(Phase::PreLock, Op::Converge, Outcome::LockVisible).on(instance);
        let deadline = t0 + wait.max(declared + CONVERGENCE_TOLERANCE_CONSTANT + poll);
        let mut slowest = Duration::ZERO;
        let mut last_unseen_sent = None;
        loop {
            let sent = t0.elapsed();
            let r = expect.call(c.route(instance, &self.resource)).await?;
            slowest = slowest.max(r.elapsed);
            if r.body.get("lock").is_some_and(|l| l.is_object()) {
                return Ok(Watched { seen_after: Some(t0.elapsed()), last_unseen_sent, slowest });
            }
            last_unseen_sent = Some(sent);
            if Instant::now() >= deadline {
                return Ok(Watched { seen_after: None, last_unseen_sent, slowest });
            }
            let next = (Instant::now() + poll).min(deadline);
            tokio::time::sleep_until(next.into()).await;
        }
    }

    /// Records what `instance` showed: its observed convergence, whether it showed the
    /// lock within `wait` (`preLock/converge`), and whether within the declared delay +
    /// the tolerance (`preLock/convergence-declared`).
    fn judge_convergence(&self, instance: usize, w: Watched, declared: Duration, wait: Duration) {
        let tolerance = CONVERGENCE_TOLERANCE_CONSTANT;
        let within_wait = w.seen_after.filter(|d| *d <= wait);
        lock(&self.rec.convergence).push(InstanceConvergence {
            instance: self.sc.settings.instances[instance].clone(),
            observed_seconds: within_wait.map(|d| d.as_secs_f64()),
            bound_seconds: wait.as_secs_f64(),
            tolerance_seconds: tolerance.as_secs_f64(),
        });
        let (obs, detail) = match within_wait {
            Some(d) => (
                Outcome::LockVisible,
                format!("visible after {:.3}s (bound {:.3}s)", d.as_secs_f64(), wait.as_secs_f64()),
            ),
            None => (
                Outcome::NotVisible,
                format!(
                    "convergence violation: lock not visible after {:.3}s (declared delay + buffer)",
                    wait.as_secs_f64()
                ),
            ),
        };
        self.expect(Phase::PreLock, Op::Converge, Outcome::LockVisible)
            .on(instance)
            .detail(detail)
            .observed(obs, within_wait.unwrap_or(wait));
        let limit = declared + tolerance;
        let shown = match w.seen_after {
            Some(d) => format!("visible after {:.3}s", d.as_secs_f64()),
            None => format!("not visible after {:.3}s", wait.max(limit).as_secs_f64()),
        };
        let unseen = match w.last_unseen_sent {
            Some(d) => {
                format!("; a route read sent {:.3}s after the pre-lock's answer still showed none", d.as_secs_f64())
            }
            None => String::new(),
        };
        // The pre-lock committed before its answer, and a read is served after it is
        // sent: a read sent later than the limit that shows no lock proves the instance
        // was still unlocked more than the declared delay after the commit, whatever the
        // round trips.
        let honest = w.seen_after.is_some() && w.last_unseen_sent.is_none_or(|d| d <= limit);
        self.expect(Phase::PreLock, Op::ConvergenceDeclared, Outcome::WithinDeclared)
            .on(instance)
            .detail(format!(
                "{shown}{unseen}; limit: declared {:.3}s + tolerance {:.3}s (slowest round trip {:.3}s)",
                declared.as_secs_f64(),
                tolerance.as_secs_f64(),
                w.slowest.as_secs_f64(),
            ))
            .observed(
                if honest { Outcome::WithinDeclared } else { Outcome::BeyondDeclared },
                w.seen_after.unwrap_or(limit),
            );
    }
}

/// What polling one instance's route found.
struct Watched {
    /// Time from the pre-lock's answer to the answer that showed the lock, if one did.
    seen_after: Option<Duration>,
    /// Time from the pre-lock's answer to the sending of the last read that showed no
    /// lock, if one did not.
    last_unseen_sent: Option<Duration>,
    /// The slowest poll's round trip.
    slowest: Duration,
}

/// `moved-unlocked` when a route view shows `to` and no lock, else what it does show.
pub(super) fn route_summary(r: &Reply, to: &str) -> Outcome {
    if r.status != 200 {
        return r.outcome();
    }
    let at = r.str_field("location").unwrap_or_default();
    let locked = r.body.get("lock").is_some_and(|l| !l.is_null());
    match (at == to, locked) {
        (true, false) => Outcome::MovedUnlocked,
        (true, true) => Outcome::MovedStillLocked,
        (false, _) => Outcome::NotMoved,
    }
}
