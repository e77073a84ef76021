//! The eager checks, each on its own test resource: the probe acts at the first instant
//! the service allows, then asserts at once, on every instance, that what was granted is
//! enforced ("once granted, enforced everywhere").
//!
//! The main walk waits the declared delay + buffer before every escalation, as a careful
//! orchestrator does; that tests the orchestrator's discipline, not the service's. A
//! service whose own gate opens too early (an `effectiveAt` counted from decide time
//! while the store committed late; a renewal that takes effect after the lease lapsed)
//! passes the main walk and fails here:
//!
//! - `eager/escalation`: every instance keeps reading while the pre-lock is in flight
//!   (so each holds what it read just before the commit), then hardDelete is escalated
//!   the moment the service allows and deletes are tombstoned on every instance at once;
//!   the same for the write lock (writes and deletes blocked, reads allowed and read
//!   through the write region); then the
//!   swap, after which a write on every instance lands at the new location and reads
//!   back there on every instance.
//! - `eager/renewal`: a short write lease is renewed just before it ends while every
//!   instance keeps writing; if the service says the renewal took (200), no write may be
//!   accepted anywhere in between; if it says the lease lapsed first (410), writes after
//!   the lapse are fair, writes before the lease's end are still not.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::check::{granted, Check};
use super::{lock, Abort, Item};
use crate::probe::target::{CallKey, Reply};
use crate::probe::vocabulary::{Op, Outcome, Phase, UserOp};

/// How long before the write lease ends the eager renewal is sent.
const RENEW_LEAD: Duration = Duration::from_millis(300);

/// The write lease of the eager renewal check: long enough to escalate and start the
/// writers, short enough to keep the cycle short.
const RENEWAL_LEASE: Duration = Duration::from_secs(2);

/// How long escalation is polled for beyond the declared delay + buffer before the
/// check gives up (a service that never lets the lock take effect).
const ESCALATION_GRACE: Duration = Duration::from_secs(10);

/// The eager checks of a cycle, run (when enabled) beside the negative checks.
#[derive(Debug, Clone, Copy)]
pub(super) enum Eager {
    Escalation,
    Renewal,
}

impl Eager {
    /// Every eager check, in the order of the cycle's resources after the negative ones.
    pub(super) const ALL: [Self; 2] = [Self::Escalation, Self::Renewal];

    /// The check's name in reports.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Escalation => "eager/escalation",
            Self::Renewal => "eager/renewal",
        }
    }
}

/// One write of the renewal check's writers: when it was sent and answered, and how.
struct Attempt {
    instance: usize,
    sent: Instant,
    answered: Instant,
    outcome: Outcome,
}

impl Check<'_> {
    /// Runs the eager check `which` on this check's resource.
    pub(super) async fn eager(&self, which: Eager) -> Result<(), Abort> {
        match which {
            Eager::Escalation => self.eager_escalation().await,
            Eager::Renewal => self.eager_renewal().await,
        }
    }

    async fn eager_escalation(&self) -> Result<(), Abort> {
        let n = self.instances();
        let s = &self.sc.settings;
        self.step(&format!("eager: escalating {} at the first instant allowed", self.resource));
        for i in 0..n {
            self.user_op(Phase::Seed, UserOp::Write, i, &format!("del-{i}"), Outcome::Allow).await?;
        }
        self.user_op(Phase::Seed, UserOp::Write, 0, "keep", Outcome::Allow).await?;
        let to = self.other_location().await?;
        let r = self.pre_lock_while_every_instance_reads(&to).await?;
        let give_up = self.give_up_at(&r);

        self.escalate_at_once(Phase::HardDelete, s.leases.hard_delete, give_up).await?;
        let deletes = (0..n).map(|i| {
            let key = format!("del-{i}");
            async move { self.user_op(Phase::HardDelete, UserOp::Delete, i, &key, Outcome::Tombstone).await }
        });
        futures::future::try_join_all(deletes).await?;

        self.escalate_at_once(Phase::Write, s.leases.write, give_up).await?;
        let blocked = (0..n).map(|i| async move {
            self.user_op(Phase::Write, UserOp::Write, i, &format!("wl-{i}"), Outcome::Block).await?;
            self.user_op(Phase::Write, UserOp::Delete, i, "keep", Outcome::Block).await?;
            let r = self.user_op(Phase::Write, UserOp::Read, i, "keep", Outcome::Allow).await?;
            // Under the write lock a read comes back through the write region.
            self.read_through(i, &r);
            Ok::<_, Abort>(r)
        });
        futures::future::try_join_all(blocked).await?;

        self.swap_then_write_everywhere(&to).await
    }

    /// The location the resource is not at (where it migrates to).
    async fn other_location(&self) -> Result<String, Abort> {
        let s = &self.sc.settings;
        let route = self
            .expect(Phase::Seed, Op::Route, Outcome::ok())
            .on(0)
            .call(self.sc.client.route(0, &self.resource))
            .await?;
        let at = route.str_field("location").unwrap_or_default();
        Ok(if at == s.locations[0] { s.locations[1].clone() } else { s.locations[0].clone() })
    }

    /// Pre-locks towards `to` while every instance keeps reading the resource, so each
    /// instance holds (in its cache) what it read just before the pre-lock committed:
    /// exactly the state a too-early escalation would meet.
    async fn pre_lock_while_every_instance_reads(&self, to: &str) -> Result<Reply, Abort> {
        let c = &self.sc.client;
        let poll = self.sc.settings.poll_interval;
        let done = CancellationToken::new();
        let readers = futures::future::join_all((0..self.instances()).map(|i| {
            let done = done.clone();
            async move {
                while !done.is_cancelled() {
                    // Warming only: what these reads answer is asserted elsewhere.
                    let _ = c.read(i, &self.resource, "keep").await;
                    tokio::time::sleep(poll).await;
                }
            }
        }));
        let pre_lock = async {
            let out = self.pre_lock(Phase::PreLock, Some(to), false).await;
            done.cancel();
            out
        };
        let (out, _) = tokio::join!(pre_lock, readers);
        match out? {
            (r, true) => Ok(r),
            (_, false) => Err(Abort::Stop),
        }
    }

    /// When to stop polling an escalation that is never allowed: the declared delay +
    /// buffer + [`ESCALATION_GRACE`] after the pre-lock's answer.
    fn give_up_at(&self, r: &Reply) -> Instant {
        let declared = self.declared(r).unwrap_or_default();
        Instant::now() + self.escalation_wait(r, declared) + ESCALATION_GRACE
    }

    /// Escalates to `phase` at the first instant the service allows: repeats the call
    /// (each a new call, under a new key) while it answers `409 invalid-transition`, every
    /// poll interval until `give_up`. Returns when the escalation was granted.
    async fn escalate_at_once(&self, phase: Phase, lease: Duration, give_up: Instant) -> Result<Instant, Abort> {
        let c = &self.sc.client;
        let token = self.token();
        let started = Instant::now();
        let mut refused = 0u32;
        loop {
            let send = |k| c.escalate(0, &self.resource, &token, phase.as_str(), lease, k);
            let expect = self.expect(phase, Op::Escalate, Outcome::ok());
            let sent = Instant::now();
            let r = expect.call(c.until_known(&CallKey::fresh(), send)).await?;
            let too_early = r.outcome() == Outcome::invalid_transition();
            if too_early && Instant::now() < give_up {
                refused += 1;
                tokio::time::sleep(self.sc.settings.poll_interval).await;
                continue;
            }
            let detail = format!(
                "granted {:.3}s after the first attempt ({refused} refused as too early)",
                started.elapsed().as_secs_f64()
            );
            return if expect.detail(detail).observed(r.outcome(), r.elapsed) { Ok(sent) } else { Err(Abort::Stop) };
        }
    }

    /// Swaps to `to`, then at once writes on every instance and reads every such write
    /// back on every instance: an acknowledged write must be at the new location.
    async fn swap_then_write_everywhere(&self, to: &str) -> Result<(), Abort> {
        let c = &self.sc.client;
        let n = self.instances();
        let token = self.token();
        let send = |k| c.swap(0, &self.resource, &token, to, k);
        self.expect(Phase::Swap, Op::Swap, Outcome::ok()).must_lock_op(c.until_known(&CallKey::fresh(), send)).await?;
        self.dropped();
        let writes = (0..n).map(|i| async move {
            self.user_op(Phase::Swap, UserOp::Write, i, &format!("post-{i}"), Outcome::Allow).await
        });
        futures::future::try_join_all(writes).await?;
        let model: Vec<(String, Item)> =
            lock(&self.items).clone().into_iter().filter(|(k, _)| k.starts_with("post-")).collect();
        for (key, item) in model {
            for i in 0..n {
                self.item_after_swap(i, &key, &item).await?;
            }
        }
        Ok(())
    }

    async fn eager_renewal(&self) -> Result<(), Abort> {
        let s = &self.sc.settings;
        let c = &self.sc.client;
        self.step(&format!("eager: renewing a write lease on {} just before it ends", self.resource));
        self.user_op(Phase::Seed, UserOp::Write, 0, "keep", Outcome::Allow).await?;
        let r = match self.pre_lock(Phase::PreLock, None, false).await? {
            (r, true) => r,
            (_, false) => return Err(Abort::Stop),
        };
        let give_up = self.give_up_at(&r);
        self.escalate_at_once(Phase::HardDelete, s.leases.hard_delete, give_up).await?;
        // The lease runs from when the service decided, which is after this send: it ends
        // no earlier than `sent + RENEWAL_LEASE`.
        let sent = self.escalate_at_once(Phase::Write, RENEWAL_LEASE, give_up).await?;
        let lease_end = sent + RENEWAL_LEASE;
        let renew_at = lease_end - RENEW_LEAD;
        let writers_from = renew_at.checked_sub(Duration::from_millis(200)).unwrap_or(renew_at);
        tokio::time::sleep_until(writers_from.into()).await;

        let done = CancellationToken::new();
        let writers = futures::future::join_all((0..self.instances()).map(|i| self.keep_writing(i, done.clone())));
        let renewal = async {
            tokio::time::sleep_until(renew_at.into()).await;
            let token = self.token();
            let send = |k| c.renew(0, &self.resource, &token, s.leases.write, k);
            let r = c.until_known(&CallKey::fresh(), send).await;
            // Stale caches matter for up to the declared delay after the renewal lands.
            let linger = r.as_ref().ok().and_then(|r| self.declared(r)).unwrap_or(Duration::from_secs(1));
            tokio::time::sleep(linger.min(Duration::from_secs(5))).await;
            done.cancel();
            r
        };
        let (renewed, attempts) = tokio::join!(renewal, writers);
        let attempts: Vec<Attempt> = attempts.into_iter().flatten().collect();
        let r = self.expect(Phase::Write, Op::Renew, Outcome::RenewedOrLapsed).call(async { renewed }).await?;
        self.judge_renewal(&r, lease_end, &attempts);
        if r.outcome() == Outcome::lock_expired() {
            self.dropped();
        }
        Ok(())
    }

    /// Writes a fresh item on `instance` every poll interval until `done`.
    async fn keep_writing(&self, instance: usize, done: CancellationToken) -> Vec<Attempt> {
        let c = &self.sc.client;
        let mut attempts = Vec::new();
        let mut k = 0;
        while !done.is_cancelled() {
            let key = format!("ren-{instance}-{k}");
            k += 1;
            let sent = Instant::now();
            if let Ok(r) = c.write(instance, &self.resource, &key, &json!({"probe": self.target()})).await {
                let outcome = super::check::classify(UserOp::Write, &r);
                attempts.push(Attempt { instance, sent, answered: Instant::now(), outcome });
            }
            tokio::time::sleep(self.sc.settings.poll_interval).await;
        }
        attempts
    }

    /// Judges the renewal `r` and the writes made around it: one assertion for the
    /// renewal, one per instance for its writes.
    fn judge_renewal(&self, r: &Reply, lease_end: Instant, attempts: &[Attempt]) {
        let renewed = granted(r).is_some() || r.status == 200;
        let lapsed = r.outcome() == Outcome::lock_expired();
        let observed = if renewed || lapsed { Outcome::RenewedOrLapsed } else { r.outcome() };
        let said = if renewed {
            "renewed (200)"
        } else if lapsed {
            "lapsed first (410)"
        } else {
            "neither"
        };
        self.expect(Phase::Write, Op::Renew, Outcome::RenewedOrLapsed)
            .detail(format!("sent {}ms before the lease's end; the service says {said}", RENEW_LEAD.as_millis()))
            .observed(observed, r.elapsed);
        for i in 0..self.instances() {
            // A renewal that took leaves no gap: every write must be blocked. One that
            // lapsed first allows writes after the lease's end, never before it.
            let must_block = |a: &&Attempt| a.instance == i && (renewed || a.answered < lease_end);
            let judged: Vec<&Attempt> = attempts.iter().filter(must_block).collect();
            let accepted = judged.iter().find(|a| a.outcome == Outcome::Allow);
            let (observed, detail) = match accepted {
                Some(a) => (
                    Outcome::Allow,
                    format!(
                        "a write sent {:+.3}s from the lease's first end was accepted; the renewal says {said}",
                        signed_secs(a.sent, lease_end)
                    ),
                ),
                None => (Outcome::Block, format!("{} writes around the renewal, all blocked", judged.len())),
            };
            self.expect(Phase::Write, UserOp::Write, Outcome::Block)
                .on(i)
                .detail(detail)
                .observed(observed, Duration::ZERO);
        }
    }
}

/// `at - reference` in seconds, negative when `at` is earlier.
fn signed_secs(at: Instant, reference: Instant) -> f64 {
    match at.checked_duration_since(reference) {
        Some(after) => after.as_secs_f64(),
        None => -(reference - at).as_secs_f64(),
    }
}
