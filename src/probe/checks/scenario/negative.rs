//! The negative checks, each on its own test resource: what the service must refuse.

use std::time::{Duration, Instant};

use chrono::TimeDelta;

use super::check::{granted, in_force, Check, Hold, LockTimes};
use super::window::{Held, Lease, Stamp, Window};
use super::{lock, Abort};
use crate::probe::checks::settings::{lapse_wait, SKEW_MARGIN_WAIT};
use crate::probe::checks::target::{CallKey, Reply};
use crate::probe::checks::vocabulary::{Op, Outcome, Phase, UserOp};

/// How many times `negative/escalate-early` asks before it leaves its question undecided.
const EARLY_ATTEMPTS: u32 = 3;

/// The negative checks of a cycle, each run on its own resource after the main walk.
#[derive(Debug, Clone, Copy)]
pub(super) enum Negative {
    SecondPreLock,
    WrongToken,
    EscalateEarly,
    WriteBeforeHardDelete,
    WriteLeaseLapse,
    ConcurrentPreLocks,
}

impl Negative {
    /// Every negative check, in the order of the cycle's resources 1.. .
    pub(super) const ALL: [Self; 6] = [
        Self::SecondPreLock,
        Self::WrongToken,
        Self::EscalateEarly,
        Self::WriteBeforeHardDelete,
        Self::WriteLeaseLapse,
        Self::ConcurrentPreLocks,
    ];

    /// The check's name in reports (`negative/<name>`).
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::SecondPreLock => "negative/second-pre-lock",
            Self::WrongToken => "negative/wrong-token",
            Self::EscalateEarly => "negative/escalate-early",
            Self::WriteBeforeHardDelete => "negative/write-before-hard-delete",
            Self::WriteLeaseLapse => "negative/write-lease-lapse",
            Self::ConcurrentPreLocks => "negative/concurrent-pre-locks",
        }
    }
}

impl Check<'_> {
    /// Runs the negative check `which` on this check's resource.
    pub(super) async fn negative(&self, which: Negative) -> Result<(), Abort> {
        match which {
            Negative::SecondPreLock => self.second_pre_lock().await,
            Negative::WrongToken => self.wrong_token().await,
            Negative::EscalateEarly => self.escalate_early().await,
            Negative::WriteBeforeHardDelete => self.write_before_hard_delete().await,
            Negative::WriteLeaseLapse => self.write_lease_lapse().await,
            Negative::ConcurrentPreLocks => self.concurrent_pre_locks().await,
        }
    }

    /// Takes the pre-lock a negative check stands on; without it the check cannot run.
    async fn must_pre_lock(&self) -> Result<Reply, Abort> {
        match self.pre_lock(Phase::PreLock, None, false).await? {
            (reply, true) => Ok(reply),
            (_, false) => Err(Abort::Stop),
        }
    }

    /// Pre-locks and waits until the lock is effective everywhere; returns the
    /// convergence delay the pre-lock declared (zero when it declared none).
    pub(super) async fn pre_lock_and_wait(&self) -> Result<Duration, Abort> {
        let r = self.must_pre_lock().await?;
        // The main walk judges the declaration; here it only paces a test resource.
        let declared = self.declared(&r).unwrap_or_default();
        let wait = self.escalation_wait(&r, declared);
        self.step(&format!("waiting {:.3}s for the pre-lock to take effect", wait.as_secs_f64()));
        tokio::time::sleep(wait).await;
        Ok(declared)
    }

    pub(super) async fn second_pre_lock(&self) -> Result<(), Abort> {
        self.step(&format!("a second pre-lock on {} must be refused", self.resource));
        self.must_pre_lock().await?;
        let s = &self.sc.settings;
        let c = &self.sc.client;
        let at = self.lock_instance();
        let send = |k| c.pre_lock(at, &self.resource, &s.owner, s.leases.pre_lock, None, k);
        let expect = self.expect(Phase::PreLock, Op::PreLockAgain, Outcome::lock_held());
        let (r, window) = self.windowed(expect.call(c.until_known(&CallKey::fresh(), send))).await;
        let r = r?;
        // The first lock holds at least its requested lease from its decision.
        let held = match self.pre_lock_lease(s.leases.pre_lock) {
            Some(lease) => in_force(&lease, &window),
            None => Err("the first pre-lock's window is unknown".into()),
        };
        expect.observed_if(held, r.outcome(), r.elapsed);
        self.release_unexpected(&r).await;
        Ok(())
    }

    pub(super) async fn wrong_token(&self) -> Result<(), Abort> {
        self.step(&format!("a wrong token on {} must be refused", self.resource));
        self.must_pre_lock().await?;
        let wrong = hex::encode(rand::random::<[u8; 16]>());
        let c = &self.sc.client;
        let lease = self.sc.settings.leases.pre_lock;
        let at = self.lock_instance();
        let renew = |k| c.renew(at, &self.resource, &wrong, lease, k);
        self.expect(Phase::PreLock, Op::Renew, Outcome::token_mismatch())
            .lock_op(c.until_known(&CallKey::fresh(), renew))
            .await?;
        let at = self.lock_instance();
        let release = |k| c.release(at, &self.resource, &wrong, k);
        self.expect(Phase::PreLock, Op::Release, Outcome::token_mismatch())
            .lock_op(c.until_known(&CallKey::fresh(), release))
            .await?;
        self.renew_past_the_maximum().await
    }

    /// The right token renews the pre-lock for a minute longer than the maximum: the
    /// lease must then end exactly at `maxExpiresAt`, not after it and not before. (On
    /// this check's resource, which is released right after: the main walk's pre-lock
    /// is not stretched to the maximum.)
    async fn renew_past_the_maximum(&self) -> Result<(), Abort> {
        let Some(before) = *lock(&self.last_view) else { return Ok(()) };
        let Some(maximum) = before.maximum() else { return Ok(()) };
        let c = &self.sc.client;
        let token = self.token();
        let lease = maximum + Duration::from_secs(60);
        let at = self.lock_instance();
        let send = |k| c.renew(at, &self.resource, &token, lease, k);
        let r = self
            .expect(Phase::PreLock, Op::Renew, Outcome::ok())
            .on(at)
            .must_lock_op(c.until_known(&CallKey::fresh(), send))
            .await?;
        let Some(after) = self.check_lock_view(Phase::PreLock, &r) else { return Ok(()) };
        let slack = TimeDelta::milliseconds(1);
        let observed = if after.expires_at > before.max_expires_at + slack {
            Outcome::PastMaximum
        } else if after.expires_at < before.max_expires_at - slack {
            Outcome::ShortOfMaximum
        } else {
            Outcome::CappedAtMaximum
        };
        self.expect(Phase::PreLock, Op::RenewCapped, Outcome::CappedAtMaximum)
            .detail(format!(
                "asked for {:.0}s; expiresAt {}, maxExpiresAt {}",
                lease.as_secs_f64(),
                after.expires_at.to_rfc3339(),
                before.max_expires_at.to_rfc3339()
            ))
            .observed(observed, r.elapsed);
        Ok(())
    }

    /// An escalation right after the pre-lock must be refused: the lock is not effective
    /// before `effectiveAt`. The probe judges only an escalation it is sure the service
    /// decided before then: one answered less than `effectiveAt - acquiredAt` (the
    /// service's own delay, so no clocks are compared; the declared convergence delay
    /// when the view has no timestamps) after the pre-lock was sent, on both of its
    /// clocks, since the service granted the pre-lock after that send and decided the
    /// escalation before that answer. An escalation it cannot be sure of (an overloaded
    /// probe or network, a step of the wall clock) is inconclusive, whatever it got: the
    /// check releases and asks again on a fresh pre-lock, up to [`EARLY_ATTEMPTS`]
    /// times, and the last attempt counts.
    pub(super) async fn escalate_early(&self) -> Result<(), Abort> {
        self.step(&format!("escalating {} before effectiveAt must be refused", self.resource));
        for attempt in 1..=EARLY_ATTEMPTS {
            let last = attempt == EARLY_ATTEMPTS;
            if self.escalate_early_once(last).await? || last {
                return Ok(());
            }
            self.release_if_held().await;
            self.step(&format!("the early escalation was not certainly early; asking again (attempt {})", attempt + 1));
        }
        Ok(())
    }

    /// One attempt of [`Self::escalate_early`]: whether it was judged. An undecided
    /// attempt that is not the `last` is shown and counted as made again.
    async fn escalate_early_once(&self, last: bool) -> Result<bool, Abort> {
        let pre_lock = self.must_pre_lock().await?;
        let s = &self.sc.settings;
        let c = &self.sc.client;
        let token = self.token();
        let at = self.lock_instance();
        let send = |k| c.escalate(at, &self.resource, &token, Phase::HardDelete.as_str(), s.leases.hard_delete, k);
        let expect = self.expect(Phase::PreLock, Op::EscalateEarly, Outcome::invalid_transition());
        let (r, window) = self.windowed(expect.call(c.until_known(&CallKey::fresh(), send))).await;
        let r = r?;
        // The service's own delay to effectiveAt; without timestamps (a failed lock-view
        // assertion already), the convergence delay it declared, which a pre-lock must
        // wait at least.
        let until_effective = LockTimes::of(&pre_lock.body)
            .ok()
            .and_then(|t| (t.effective_at - t.acquired_at).to_std().ok())
            .or_else(|| self.declared(&pre_lock));
        let before_effective = match (until_effective, self.pre_lock_window()) {
            // "In force" of a span that starts with the pre-lock is "before effectiveAt".
            (Some(d), Some(pre_lock)) => match Lease::granted(pre_lock, d).held_over(&window) {
                Held::Certainly => Ok(()),
                Held::Over => Err("sent after effectiveAt had certainly passed".to_owned()),
                Held::Uncertain(why) => Err(format!("not certainly before effectiveAt: {why}")),
            },
            _ => Err("the pre-lock's view does not say when it takes effect".to_owned()),
        };
        match before_effective {
            Err(why) if !last => {
                self.count_retried(Phase::PreLock);
                expect.undecided(r.outcome(), r.elapsed, format!("{why} (asked again)"));
                Ok(false)
            }
            held => {
                let judged = held.is_ok();
                expect.observed_if(held, r.outcome(), r.elapsed);
                Ok(judged)
            }
        }
    }

    pub(super) async fn write_before_hard_delete(&self) -> Result<(), Abort> {
        self.step(&format!("escalating {} to write before hardDelete must be refused", self.resource));
        self.pre_lock_and_wait().await?;
        let s = &self.sc.settings;
        let c = &self.sc.client;
        let token = self.token();
        let at = self.lock_instance();
        let send = |k| c.escalate(at, &self.resource, &token, Phase::Write.as_str(), s.leases.write, k);
        self.expect(Phase::PreLock, Op::EscalateWrite, Outcome::invalid_transition())
            .lock_op(c.until_known(&CallKey::fresh(), send))
            .await?;
        Ok(())
    }

    pub(super) async fn write_lease_lapse(&self) -> Result<(), Abort> {
        self.step(&format!("a short write lease on {} must lapse by itself", self.resource));
        self.pre_lock_and_wait().await?;
        let s = &self.sc.settings;
        let c = &self.sc.client;
        self.escalate_to(Phase::HardDelete, s.leases.hard_delete).await?;
        let Some(write) = self.escalate_to_short(Phase::Write, s.leases.short_write).await? else {
            return Ok(());
        };
        let lease = Lease::granted(write.window, s.leases.short_write);
        let lapse = lapse_wait(s.leases.short_write, s.buffer);
        self.step(&format!("waiting {:.3}s for the write lease to lapse", lapse.as_secs_f64()));
        tokio::time::sleep(lapse).await;
        let announced = self.after_any_skew_margin(0, "after-lapse").await;
        let over = Hold::Over(&lease, announced);
        self.user_op_under(Phase::Write, UserOp::Write, 0, "after-lapse", Outcome::Allow, over).await?;
        // Swap towards the other location, so only the lapsed lease can be the refusal.
        let route = self.expect(Phase::Write, Op::Route, Outcome::ok()).on(0).call(c.route(0, &self.resource)).await?;
        let to = if route.str_field("location") == Some(s.locations[0].as_str()) {
            &s.locations[1]
        } else {
            &s.locations[0]
        };
        let token = self.token();
        let at = self.lock_instance();
        let send = |k| c.swap(at, &self.resource, &token, to, k);
        let expect = self.expect(Phase::Write, Op::SwapAfterLapse, Outcome::lock_expired());
        let (r, window) = self.windowed(expect.call(c.until_known(&CallKey::fresh(), send))).await;
        let r = r?;
        // The holder's token is dead once the lease has ended by the deciding clock.
        let lapsed = match lease.over_when_sent(&window, Duration::ZERO) {
            Held::Over => Ok(()),
            Held::Certainly => Err("sent while the lease was in force".to_owned()),
            Held::Uncertain(why) => Err(why),
        };
        expect.observed_if(lapsed, r.outcome(), r.elapsed);
        if r.status == 200 {
            // The service swapped on a dead token: nothing is held any more.
            self.dropped();
        }
        Ok(())
    }

    /// A lease ends for its holder at `expiresAt`, but a service keeps enforcing it for
    /// its skew margin beyond that, until the lease has ended by every clock it allows
    /// for (contract 1.1), and says for how long in `Retry-After`. This peeks with a
    /// write of a throwaway value (the asserted write overwrites it): a `423` whose
    /// `Retry-After` is short is waited out once (at most [`SKEW_MARGIN_WAIT`], from the
    /// check's skew allowance); a lock that does not lapse still fails the assertion that
    /// follows. Returns when the peek's `423` arrived and the enforcement it announced
    /// (unbounded when it named none), for the assertion to be held to.
    async fn after_any_skew_margin(&self, instance: usize, key: &str) -> Option<(Stamp, Duration)> {
        let c = &self.sc.client;
        let probe_value = serde_json::json!({"probe": self.target(), "peek": true});
        let (r, Window { answered, .. }) = self.windowed(c.write(instance, &self.resource, key, &probe_value)).await;
        let r = r.ok().filter(|r| r.status == 423)?;
        let wait = r.retry_after.as_deref().and_then(|s| s.trim().parse().ok()).map(Duration::from_secs);
        if let Some(wait) = wait.filter(|w| *w <= SKEW_MARGIN_WAIT) {
            let wait = self.take_skew_allowance(wait);
            self.step(&format!(
                "the lease is still enforced within the service's skew margin; waiting {:.1}s",
                wait.as_secs_f64()
            ));
            tokio::time::sleep(wait).await;
        }
        Some((answered, wait.unwrap_or(Duration::MAX)))
    }

    pub(super) async fn concurrent_pre_locks(&self) -> Result<(), Abort> {
        let s = &self.sc.settings;
        let n = s.concurrent_pre_locks;
        self.step(&format!("{n} concurrent pre-locks on {} must give exactly one winner", self.resource));
        if let Err(e) = self.sc.state.record_intent(&s.name, &self.resource, None) {
            tracing::error!(error = %e, resource = %self.resource, "concurrent pre-locks not sent: their intent could not be recorded in the state file");
            return Err(Abort::journal(&self.resource, &e));
        }
        let started = Instant::now();
        let replies = futures::future::join_all((0..n).map(|k| {
            let owner = format!("{}#{k}", s.owner);
            let inst = k % self.instances();
            async move {
                self.sc.client.pre_lock(inst, &self.resource, &owner, s.leases.pre_lock, None, CallKey::fresh()).await
            }
        }))
        .await;
        let mut winners = Vec::new();
        let mut losers_ok = 0;
        let mut others = Vec::new();
        for r in replies {
            match r {
                // Any granted lock is a winner, whatever its status: it must be released.
                Ok(r) if granted(&r).is_some() => winners.push(granted(&r).unwrap_or_default().to_string()),
                Ok(r) if r.outcome() == Outcome::lock_held() => losers_ok += 1,
                Ok(r) => others.push(r.outcome().to_string()),
                Err(e) => others.push(e.to_string()),
            }
        }
        self.expect(Phase::PreLock, Op::PreLockRace, Outcome::winners(1))
            .detail(format!("{losers_ok} refused with 423 lock-held, other outcomes: {others:?}"))
            .observed(Outcome::winners(winners.len()), started.elapsed());
        let losers = if losers_ok + winners.len() == n { Outcome::lock_held() } else { Outcome::OtherOutcome };
        self.expect(Phase::PreLock, Op::PreLockRaceLosers, Outcome::lock_held()).observed(losers, started.elapsed());
        let mut winners = winners.into_iter();
        match winners.next() {
            Some(first) => self.hold(&first),
            None => {
                let _ = self.sc.state.forget(&s.name, &self.resource);
            }
        }
        // More than one winner is a bug in the service; do not leave its extra locks behind.
        for extra in winners {
            let _ = self.sc.client.release(self.lock_instance(), &self.resource, &extra, CallKey::fresh()).await;
        }
        Ok(())
    }
}
