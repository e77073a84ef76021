//! The main migration walk of a cycle: seed, pre-lock and convergence, hardDelete,
//! write lock, swap, and the item check at the new location.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::check::{classify, Check};
use super::{lock, Abort, Item};
use crate::probe::report::InstanceConvergence;
use crate::probe::target::{CallKey, Reply};

impl Check<'_> {
    /// The main migration walk on the cycle's resource.
    pub(super) async fn walk(&self) -> Result<(), Abort> {
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
        let (r, ok) = self.pre_lock("preLock", Some(&to), true).await?;
        if !ok {
            return Err(Abort::Stop);
        }
        let t0 = Instant::now();
        // Without a declared delay there is no safe time to escalate: the walk stops (and
        // releases) rather than guess.
        let Some(declared) = self.declared(&r) else {
            self.assert(
                "preLock",
                "convergence-delay",
                None,
                "declared",
                "missing",
                r.elapsed,
                Some("no usable convergenceDelaySeconds in the lock view".into()),
            );
            return Err(Abort::Stop);
        };
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
        let wait = self.escalation_wait(&r, declared);

        self.step(&format!(
            "measuring convergence on {n} instances (declared {:.3}s, waiting {:.3}s) while checking nothing is restricted yet",
            declared.as_secs_f64(),
            wait.as_secs_f64()
        ));
        // Side by side: convergence is timed from the pre-lock, so the user operations
        // must not run first and add their own latency to it.
        let unrestricted = self.on_every_instance(
            "preLock",
            [("read", "keep", "allow"), ("write", "pl", "allow"), ("delete", "pl", "allow")],
        );
        futures::future::try_join(self.converge(t0, wait), unrestricted).await?;
        tokio::time::sleep_until((t0 + wait).into()).await;

        let t1 = self.escalate_after("preLock", t0, "hardDelete", s.leases.hard_delete).await?;
        self.on_every_instance(
            "hardDelete",
            [("read", "keep", "allow"), ("write", "keep", "allow"), ("delete", "del", "tombstone")],
        )
        .await?;
        for i in 0..n {
            for j in 0..n {
                // The contract demands a tombstone here, whatever the delete answered.
                self.read_back_expecting("hardDelete", j, &format!("del-{i}"), "tombstone")
                    .await?;
            }
        }

        let t2 = self.escalate_after("hardDelete", t1, "write", s.leases.write).await?;
        self.on_every_instance(
            "write",
            [("read", "keep", "allow"), ("write", "wl", "block"), ("delete", "wl", "block")],
        )
        .await?;

        self.step(&format!("swapping {res} to {to:?}"));
        let token = self.token();
        let send = |k| c.swap(0, &res, &token, &to, k);
        let r = self.must_lock_op("swap", "swap", "200", c.until_known(&CallKey::fresh(), send)).await?;
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
        }
        self.on_every_instance(
            "swap",
            [("read", "keep", "allow"), ("write", "post", "allow"), ("delete", "post", "allow")],
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
    async fn item_after_swap(&self, instance: usize, key: &str, item: &Item) -> Result<(), Abort> {
        let expected = match item {
            Item::Present(_) => "present",
            Item::Tombstone | Item::Absent => "not-resurrected",
        };
        let r = self
            .call(
                "swap",
                "items",
                Some(instance),
                expected,
                self.sc.client.read(instance, &self.resource, key),
            )
            .await?;
        let observed = match item {
            Item::Present(v) => match (r.status, r.body.get("tombstone"), r.body.get("value")) {
                (200, Some(Value::Bool(true)), _) => "tombstone".to_string(),
                (200, _, Some(got)) if got == v => "present".to_string(),
                (200, _, _) => "wrong-value".to_string(),
                (404, _, _) => "absent".to_string(),
                _ => r.outcome(),
            },
            Item::Tombstone | Item::Absent => match (r.status, r.body.get("tombstone")) {
                (200, Some(Value::Bool(true))) | (404, _) => "not-resurrected".to_string(),
                (200, _) => "resurrected".to_string(),
                _ => r.outcome(),
            },
        };
        self.assert(
            "swap",
            "items",
            Some(instance),
            expected,
            &observed,
            r.elapsed,
            Some(format!("item {key}")),
        );
        Ok(())
    }

    /// Reads `key` on `instance` and compares it with the model.
    pub(super) async fn read_back(
        &self,
        phase: &str,
        instance: usize,
        key: &str,
    ) -> Result<(), Abort> {
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
    pub(super) async fn read_back_expecting(
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
    pub(super) async fn converge(&self, t0: Instant, wait: Duration) -> Result<(), Abort> {
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
                bound_seconds: wait.as_secs_f64(),
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
}

/// `moved-unlocked` when a route view shows `to` and no lock, else what it does show.
pub(super) fn route_summary(r: &Reply, to: &str) -> String {
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
