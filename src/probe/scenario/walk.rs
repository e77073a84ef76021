//! The main migration walk of a cycle: seed, pre-lock and convergence, hardDelete,
//! write lock, swap, and the item check at the new location.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::check::{classify, Check};
use super::{lock, Abort, Item};
use crate::probe::report::InstanceConvergence;
use crate::probe::target::{CallKey, Reply};
use crate::probe::vocabulary::{Op, Outcome, Phase, UserOp};

impl Check<'_> {
    /// The main migration walk on the cycle's resource: each step stands on the one
    /// before it, and the walk stops at the first that does not give what the next needs.
    pub(super) async fn walk(&self) -> Result<(), Abort> {
        let to = self.seed().await?;
        let pre_locked = self.pre_lock_and_converge(&to).await?;
        let hard_delete = self.hard_delete_phase(pre_locked).await?;
        let write = self.write_phase(hard_delete).await?;
        self.swap_and_check(&to, write).await
    }

    /// Writes three items through every instance and reads each back on every instance;
    /// returns the location the resource migrates to (the one it is not at).
    async fn seed(&self) -> Result<String, Abort> {
        let n = self.instances();
        let s = &self.sc.settings;
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
    async fn pre_lock_and_converge(&self, to: &str) -> Result<Instant, Abort> {
        let (r, ok) = self.pre_lock(Phase::PreLock, Some(to), true).await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let t0 = Instant::now();
        let declared = self.judge_declared(&r)?;
        let wait = self.escalation_wait(&r, declared);
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
        futures::future::try_join(self.converge(t0, wait), unrestricted).await?;
        tokio::time::sleep_until((t0 + wait).into()).await;
        Ok(t0)
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
    async fn hard_delete_phase(&self, pre_locked: Instant) -> Result<Instant, Abort> {
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
    async fn write_phase(&self, hard_deleted: Instant) -> Result<Instant, Abort> {
        let lease = self.sc.settings.leases.write;
        let since = self.escalate_after(Phase::HardDelete, hard_deleted, Phase::Write, lease).await?;
        self.on_every_instance(
            Phase::Write,
            [
                (UserOp::Read, "keep", Outcome::Allow),
                (UserOp::Write, "wl", Outcome::Block),
                (UserOp::Delete, "wl", Outcome::Block),
            ],
        )
        .await?;
        Ok(since)
    }

    /// Swaps to `to` (the write lock held since `write_locked`): every route view shows
    /// the new location and no lock, user operations are allowed, and every item is at
    /// the new location as last written, none resurrected.
    async fn swap_and_check(&self, to: &str, write_locked: Instant) -> Result<(), Abort> {
        let n = self.instances();
        let c = &self.sc.client;
        let res = &self.resource;
        self.step(&format!("swapping {res} to {to:?}"));
        let token = self.token();
        let send = |k| c.swap(0, res, &token, to, k);
        let r = self
            .expect(Phase::Swap, Op::Swap, Outcome::ok())
            .must_lock_op(c.until_known(&CallKey::fresh(), send))
            .await?;
        lock(&self.rec.phases).push((Phase::Write, write_locked.elapsed().as_secs_f64()));
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

    /// Polls the route view of every instance until it shows the lock or `wait` has passed
    /// since `t0`; records the observed convergence and one assertion per instance.
    pub(super) async fn converge(&self, t0: Instant, wait: Duration) -> Result<(), Abort> {
        let c = &self.sc.client;
        let deadline = t0 + wait;
        let poll = self.sc.settings.poll_interval;
        let per_instance = (0..self.instances()).map(|i| async move {
            let expect = self.expect(Phase::PreLock, Op::Converge, Outcome::LockVisible).on(i);
            loop {
                let r = expect.call(c.route(i, &self.resource)).await?;
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
                bound_seconds: wait.as_secs_f64(),
            });
            let (obs, detail) = match observed {
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
                .on(i)
                .detail(detail)
                .observed(obs, observed.unwrap_or(wait));
        }
        Ok(())
    }
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
