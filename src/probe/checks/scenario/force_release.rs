//! `negative/force-release` (contract 1.4): the check takes a write lock on its own test
//! resource, two admin principals remove it (one requests, the other approves, and the
//! requester's own approval must be refused), then the old token must be refused on
//! every instance and user writes must go through once caches have converged.

use std::time::Duration;

use serde_json::Value;

use super::check::{Check, Hold};
use super::window::{Lease, Window};
use super::Abort;
use crate::probe::checks::settings::{escalation_wait, AdminKeys};
use crate::probe::checks::target::{CallKey, Reply};
use crate::probe::checks::vocabulary::{Op, Outcome, Phase, UserOp};

/// The check's name in reports.
pub(super) const NAME: &str = "negative/force-release";

/// The reason the check's requests give (the audit trail shows it).
const REASON: &str = "lockprobe force-release check on its own test lock";

/// The longest request id the check puts in a URL.
const MAX_REQUEST_ID: usize = 128;

/// The resource the check runs on: named after the cycle's main resource (as a
/// group's claim is), so a pool needs no more resources for it and two cycles never
/// share it.
pub(super) fn resource_of(main: &str) -> String {
    format!("{main}-force-release")
}

/// The request id a request's answer names, if it is one the check can put in a path.
fn request_id(r: &Reply) -> Option<&str> {
    let id = r.body.get("request")?.get("id")?.as_str()?;
    let usable = !id.is_empty()
        && id.len() <= MAX_REQUEST_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    usable.then_some(id)
}

impl Check<'_> {
    /// Runs the check with the two principals' `keys`.
    pub(super) async fn force_release(&self, keys: &AdminKeys) -> Result<(), Abort> {
        let s = &self.sc.settings;
        self.step(&format!("a write lock on {} is force-released by two principals", self.resource));
        let declared = self.pre_lock_and_wait().await?;
        self.escalate_to(Phase::HardDelete, s.leases.hard_delete).await?;
        let write = self.escalate_to(Phase::Write, s.leases.write).await?;
        let lease = Lease::granted(write.window, s.leases.write);
        // Blocked first, so that writes going through later say the release ended it.
        for i in 0..self.instances() {
            let key = format!("fr-{i}");
            self.user_op_under(Phase::Write, UserOp::Write, i, &key, Outcome::Block, Hold::InForce(&lease)).await?;
        }
        let approved = self.removed_by_two_principals(keys).await?;
        // The token is kept (and journaled) until the service has refused it everywhere:
        // a service that acknowledged the approval and kept the lock still has it
        // released on the way out.
        self.old_token_refused_everywhere(Op::Renew).await?;
        self.writes_resume(approved, declared).await?;
        self.old_token_refused_everywhere(Op::Release).await?;
        // Refused everywhere, or released by one of those calls: nothing is held.
        self.dropped();
        Ok(())
    }

    /// Asks for the lock's removal as the requester, has the requester's own approval
    /// refused, and approves as the other principal. Returns the window of the approval
    /// that removed the lock.
    async fn removed_by_two_principals(&self, keys: &AdminKeys) -> Result<Window, Abort> {
        let c = &self.sc.client;
        let owner = &self.sc.settings.owner;
        let at = self.lock_instance();
        let view = self
            .expect(Phase::Write, Op::ForceReleaseView, Outcome::ok())
            .on(at)
            .must_lock_op(c.force_release_view(at, &self.resource, &keys.requester))
            .await?;
        let lock = view.body.get("lock").unwrap_or(&Value::Null);
        let field = |name: &str| lock.get(name).and_then(Value::as_str);
        let own = field("owner") == Some(owner.as_str()) && field("phase") == Some(Phase::Write.as_str());
        let fingerprint = field("fingerprint").unwrap_or_default().to_owned();
        let shown = format!(
            "the view shows owner {:?}, phase {:?}, fingerprint {}",
            field("owner").unwrap_or("none"),
            field("phase").unwrap_or("none"),
            if fingerprint.is_empty() { "none" } else { "given" }
        );
        let observed = if own && !fingerprint.is_empty() { Outcome::OwnLock } else { Outcome::NotOwnLock };
        if !self
            .expect(Phase::Write, Op::ForceReleaseView, Outcome::OwnLock)
            .on(at)
            .detail(shown)
            .observed(observed, view.elapsed)
        {
            return Err(Abort::Stop);
        }

        let at = self.lock_instance();
        let phase = Phase::Write.as_str();
        let send = |k| c.request_force_release(at, &self.resource, &keys.requester, &fingerprint, phase, REASON, k);
        let request = self
            .expect(Phase::Write, Op::ForceReleaseRequest, Outcome::created())
            .on(at)
            .must_lock_op(c.until_known(&CallKey::fresh(), send))
            .await?;
        let Some(id) = request_id(&request).map(str::to_owned) else {
            self.expect(Phase::Write, Op::ForceReleaseRequest, Outcome::created())
                .on(at)
                .detail(format!(
                    "the answer names no usable request id (at most {MAX_REQUEST_ID} letters, digits, '-', '_')"
                ))
                .observed(Outcome::Other("no request id".into()), request.elapsed);
            return Err(Abort::Stop);
        };

        let at = self.lock_instance();
        let send = |k| c.approve_force_release(at, &self.resource, &keys.requester, &id, k);
        let (own_approval, own_window) = self
            .windowed(
                self.expect(Phase::Write, Op::SelfApproval, Outcome::self_approval())
                    .on(at)
                    .lock_op(c.until_known(&CallKey::fresh(), send)),
            )
            .await;
        let (own_approval, _) = own_approval?;
        if (200..300).contains(&own_approval.status) {
            // Failed already; the lock is gone all the same, and what follows is judged
            // from this approval.
            return Ok(own_window);
        }

        let at = self.lock_instance();
        let send = |k| c.approve_force_release(at, &self.resource, &keys.approver, &id, k);
        let expect = self.expect(Phase::Write, Op::ForceReleaseApprove, Outcome::ok()).on(at);
        let (r, window) = self.windowed(expect.call(c.until_known(&CallKey::fresh(), send))).await;
        let r = r?;
        let status = r.body.get("request").and_then(|v| v.get("status")).and_then(Value::as_str);
        let observed = match (r.status, status) {
            (200, Some("released")) => Outcome::ok(),
            (200, other) => Outcome::Other(format!("200 with status {}", other.unwrap_or("missing"))),
            _ => r.outcome(),
        };
        if expect.observed(observed, r.elapsed) {
            Ok(window)
        } else {
            Err(Abort::Stop)
        }
    }

    /// The old token, after the approval's answer, must be refused by every instance's
    /// lock API for `op` (a renewal, or a release): `410 lock-force-released`; an
    /// instance that declares an earlier contract knows no force-release and refuses it
    /// as any token that is not the live lock's, `409 token-mismatch`. Lock calls are
    /// decided on the store, not a cache, so no convergence is waited for.
    async fn old_token_refused_everywhere(&self, op: Op) -> Result<(), Abort> {
        let c = &self.sc.client;
        let old = self.token();
        let lease = self.sc.settings.leases.write;
        for i in 0..self.instances() {
            let expected = if c.declared_by(i).at_least(1, 4) == Some(true) {
                Outcome::lock_force_released()
            } else {
                Outcome::token_mismatch()
            };
            let expect = self.expect(Phase::ForceReleased, op, expected).on(i);
            let key = CallKey::fresh();
            if op == Op::Release {
                expect.lock_op(c.until_known(&key, |k| c.release(i, &self.resource, &old, k))).await?;
            } else {
                expect.lock_op(c.until_known(&key, |k| c.renew(i, &self.resource, &old, lease, k))).await?;
            }
        }
        Ok(())
    }

    /// Once the caches that held the lock have converged (the declared delay after the
    /// approval's answer, plus the buffer, never less than the replication bound), a
    /// write and a delete on every instance must go through. Each is held to that span:
    /// one sent before its latest end (a wall-clock step) is inconclusive.
    async fn writes_resume(&self, approved: Window, declared: Duration) -> Result<(), Abort> {
        let s = &self.sc.settings;
        let wait = escalation_wait(declared, s.buffer, s.replication_bound);
        let until = approved.answered.mono + wait;
        self.step(&format!("waiting {:.3}s for the caches to let go of the released lock", wait.as_secs_f64()));
        tokio::time::sleep_until(until.into()).await;
        let stale = Lease::granted(approved, declared);
        for i in 0..self.instances() {
            let key = format!("fr-{i}");
            let over = Hold::Over(&stale, None);
            self.user_op_under(Phase::ForceReleased, UserOp::Write, i, &key, Outcome::Allow, over).await?;
            self.user_op_under(Phase::ForceReleased, UserOp::Delete, i, &key, Outcome::Allow, over).await?;
        }
        Ok(())
    }
}
