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
//!
//! Every operation is held to the lock only over its decision window ([`super::window`]):
//! one whose window meets the instant the lease may end, or during which the wall clock
//! stepped, is inconclusive.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::check::{granted, Check, Hold};
use super::window::{signed_secs, Held, Lease, Window};
use super::{lock, Abort, Item};
use crate::probe::checks::target::{CallKey, Reply};
use crate::probe::checks::vocabulary::{Op, Outcome, Phase, UserOp};

/// How long before the write lease ends the eager renewal is sent.
const RENEW_LEAD: Duration = Duration::from_millis(300);

/// How long before the renewal the writers start: long enough that each instance's
/// writes held to the lease outnumber the one whose window may meet its end.
const WRITERS_LEAD: Duration = Duration::from_millis(500);

/// The write lease of the eager renewal check: long enough to escalate and start the
/// writers, short enough to keep the cycle short.
pub(crate) const RENEWAL_LEASE: Duration = Duration::from_secs(2);

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
    window: Window,
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

        let granted = self.escalate_at_once(Phase::HardDelete, s.leases.hard_delete, give_up).await?;
        let hard_delete = Lease::granted(granted, s.leases.hard_delete);
        let deletes = (0..n).map(|i| {
            let (key, lease) = (format!("del-{i}"), &hard_delete);
            async move {
                self.user_op_under(Phase::HardDelete, UserOp::Delete, i, &key, Outcome::Tombstone, Hold::InForce(lease))
                    .await
            }
        });
        futures::future::try_join_all(deletes).await?;

        let granted = self.escalate_at_once(Phase::Write, s.leases.write, give_up).await?;
        let write = Lease::granted(granted, s.leases.write);
        let blocked = (0..n).map(|i| {
            let lease = Hold::InForce(&write);
            async move {
                let key = format!("wl-{i}");
                self.user_op_under(Phase::Write, UserOp::Write, i, &key, Outcome::Block, lease).await?;
                self.user_op_under(Phase::Write, UserOp::Delete, i, "keep", Outcome::Block, lease).await?;
                let (r, judged) =
                    self.user_op_under(Phase::Write, UserOp::Read, i, "keep", Outcome::Allow, lease).await?;
                // Under the write lock a read comes back through the write region (asked
                // only of a read the lock certainly held over).
                if judged {
                    self.read_through(i, &r);
                }
                Ok::<_, Abort>(r)
            }
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
    /// poll interval until `give_up`. Returns the window of the call that was granted.
    async fn escalate_at_once(&self, phase: Phase, lease: Duration, give_up: Instant) -> Result<Window, Abort> {
        let c = &self.sc.client;
        let token = self.token();
        let started = Instant::now();
        let mut refused = 0u32;
        loop {
            let send = |k| c.escalate(0, &self.resource, &token, phase.as_str(), lease, k);
            let expect = self.expect(phase, Op::Escalate, Outcome::ok());
            let (r, window) = self.windowed(expect.call(c.until_known(&CallKey::fresh(), send))).await;
            let r = r?;
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
            return if expect.detail(detail).observed(r.outcome(), r.elapsed) { Ok(window) } else { Err(Abort::Stop) };
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
        // no earlier than the send + RENEWAL_LEASE (on both clocks: see `window`).
        let granted = self.escalate_at_once(Phase::Write, RENEWAL_LEASE, give_up).await?;
        let write = Lease::granted(granted, RENEWAL_LEASE);
        let renew_at = granted.sent.mono + RENEWAL_LEASE - RENEW_LEAD;
        let writers_from = renew_at.checked_sub(WRITERS_LEAD).unwrap_or(renew_at);
        tokio::time::sleep_until(writers_from.into()).await;

        let done = CancellationToken::new();
        let writers = futures::future::join_all((0..self.instances()).map(|i| self.keep_writing(i, done.clone())));
        let renewal = async {
            tokio::time::sleep_until(renew_at.into()).await;
            let token = self.token();
            let send = |k| c.renew(0, &self.resource, &token, s.leases.write, k);
            let (r, window) = self.windowed(c.until_known(&CallKey::fresh(), send)).await;
            // Stale caches matter for up to the declared delay after the renewal lands.
            let linger = r.as_ref().ok().and_then(|r| self.declared(r)).unwrap_or(Duration::from_secs(1));
            tokio::time::sleep(linger.min(Duration::from_secs(5))).await;
            done.cancel();
            (r, window)
        };
        let ((renewed, renewal), attempts) = tokio::join!(renewal, writers);
        let attempts: Vec<Attempt> = attempts.into_iter().flatten().collect();
        let r = self.expect(Phase::Write, Op::Renew, Outcome::RenewedOrLapsed).call(async { renewed }).await?;
        self.judge_renewal(&r, write, renewal, &attempts);
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
            let value = json!({"probe": self.target()});
            if let (Ok(r), window) = self.windowed(c.write(instance, &self.resource, &key, &value)).await {
                let outcome = super::check::classify(UserOp::Write, &r);
                attempts.push(Attempt { instance, window, outcome });
            }
            tokio::time::sleep(self.sc.settings.poll_interval).await;
        }
        attempts
    }

    /// Judges the renewal `r` (made in `renewal`) and the writes made around the end of
    /// the `write` lease: one assertion for the renewal; per instance, one for its
    /// writes the lock certainly held over, and one for those it may not have
    /// (inconclusive), each write counted in the check's tally.
    fn judge_renewal(&self, r: &Reply, write: Lease, renewal: Window, attempts: &[Attempt]) {
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
        // A renewal that took leaves no gap: the lock holds until the renewed lease ends.
        // One that lapsed first holds writes to the lease's first end; after its latest
        // end any answer is fair (the lock's end within the skew margin, or no lock).
        let lease = if renewed { write.renewed(renewal, self.sc.settings.leases.write) } else { write };
        let first_end = write.counted_from.sent.mono + write.lease;
        for i in 0..self.instances() {
            let mut held = Vec::new();
            let mut undecided = Vec::new();
            for a in attempts.iter().filter(|a| a.instance == i) {
                match lease.held_over(&a.window) {
                    Held::Certainly => held.push(a),
                    Held::Over if !renewed => {}
                    Held::Over => undecided.push((a, "sent after the renewed lease's latest end".to_owned())),
                    Held::Uncertain(why) => undecided.push((a, why)),
                }
            }
            for _ in &held {
                self.count_held(Phase::Write);
            }
            for (_, why) in &undecided {
                self.count_inconclusive(Phase::Write, why.clone());
            }
            if !held.is_empty() {
                let (observed, detail) = match held.iter().find(|a| a.outcome == Outcome::Allow) {
                    Some(a) => (
                        Outcome::Allow,
                        format!(
                            "a write sent {:+.3}s from the lease's first end was accepted; the renewal says {said}",
                            signed_secs(a.window.sent.mono, first_end)
                        ),
                    ),
                    None => (Outcome::Block, format!("{} writes around the renewal, all blocked", held.len())),
                };
                self.expect(Phase::Write, UserOp::Write, Outcome::Block)
                    .on(i)
                    .detail(detail)
                    .observed(observed, Duration::ZERO);
            }
            if let Some((first, why)) = undecided.first() {
                let accepted = undecided.iter().filter(|(a, _)| a.outcome == Outcome::Allow).count();
                self.expect(Phase::Write, UserOp::Write, Outcome::Block)
                    .on(i)
                    .detail(format!(
                        "{} writes not held to the lease ({accepted} accepted), the first sent {:+.3}s from its first end; the renewal says {said}",
                        undecided.len(),
                        signed_secs(first.window.sent.mono, first_end)
                    ))
                    .undecided(first.outcome.clone(), Duration::ZERO, why.clone());
            }
        }
    }
}
