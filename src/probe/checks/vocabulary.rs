//! The probe's vocabulary: the lock phase a check runs in, the operation it makes and
//! the outcome it expects and observes. Each is an enum whose `as_str()` is the label
//! on the wire, in the JUnit and JSON reports and in metrics, so the set of labels is
//! closed where it must be (phases, operations, expected outcomes) and open only where
//! a service answers with something of its own (an HTTP status and problem type).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Implements `Display`, `Serialize` and `Deserialize` through `as_str` / `from_label`.
macro_rules! labelled {
    ($ty:ident) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let label = String::deserialize(d)?;
                $ty::from_label(&label)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown {} {label:?}", stringify!($ty))))
            }
        }
    };
}

/// Generates an enum of unit variants with one label each, `ALL`, `as_str` and
/// `from_label`.
macro_rules! vocabulary {
    ($(#[$meta:meta])* $vis:vis enum $ty:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $ty {
            $($(#[$vmeta])* $variant,)+
        }

        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant,)+];

            /// The label: on the wire, in reports and in metrics.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $label,)+
                }
            }

            /// The value whose label is `label`.
            pub fn from_label(label: &str) -> Option<Self> {
                match label {
                    $($label => Some($ty::$variant),)+
                    _ => None,
                }
            }
        }

        labelled!($ty);
    };
}

vocabulary! {
    /// The part of a cycle a check runs in: the lock phase in force, or the steps before
    /// and after the lock.
    pub enum Phase {
        /// Items written and read back before any lock.
        Seed => "seed",
        /// The pre-lock: nothing restricted yet, convergence measured.
        PreLock => "preLock",
        /// Deletes become tombstones.
        HardDelete => "hardDelete",
        /// Writes and deletes are blocked.
        Write => "write",
        /// After the swap: the new location, no lock.
        Swap => "swap",
        /// Releasing what a check still holds.
        Cleanup => "cleanup",
        /// After a force-release: no lock, and its old holder fenced.
        ForceReleased => "forceReleased",
    }
}

impl Phase {
    /// The lock phases, in lifecycle order (the contract's `phase` values).
    pub const LOCK: [Phase; 3] = [Phase::PreLock, Phase::HardDelete, Phase::Write];
}

vocabulary! {
    /// A user operation on an item, judged against the enforcement table.
    pub enum UserOp {
        /// `GET /items/{key}`.
        Read => "read",
        /// `PUT /items/{key}`.
        Write => "write",
        /// `DELETE /items/{key}`.
        Delete => "delete",
    }
}

vocabulary! {
    /// What a check did.
    pub enum Op {
        /// `GET /items/{key}`.
        Read => "read",
        /// `PUT /items/{key}`.
        Write => "write",
        /// `DELETE /items/{key}`.
        Delete => "delete",
        /// An item read back to compare with what was written.
        ReadBack => "read-back",
        /// An item read at the new location after the swap.
        Items => "items",
        /// `GET /route`.
        Route => "route",
        /// The route view of every instance polled until it shows the pre-lock.
        Converge => "converge",
        /// The pre-lock's answer declares a convergence delay.
        ConvergenceDelay => "convergence-delay",
        /// The declared convergence delay is the one configured.
        DeclaredConvergence => "declared-convergence",
        /// `POST /lock`.
        PreLock => "pre-lock",
        /// A second `POST /lock` while the first holds.
        PreLockAgain => "pre-lock-again",
        /// `POST /lock` repeated under its idempotency key.
        PreLockReplay => "pre-lock-replay",
        /// Concurrent `POST /lock`s: how many won.
        PreLockRace => "pre-lock-race",
        /// Concurrent `POST /lock`s: how the others were refused.
        PreLockRaceLosers => "pre-lock-race-losers",
        /// `POST /lock/escalate`.
        Escalate => "escalate",
        /// `POST /lock/escalate` before `effectiveAt`.
        EscalateEarly => "escalate-early",
        /// `POST /lock/escalate` to write before hardDelete.
        EscalateWrite => "escalate-write",
        /// `POST /lock/renew`.
        Renew => "renew",
        /// `POST /lock/swap`.
        Swap => "swap",
        /// `POST /lock/swap` with a lapsed lease.
        SwapAfterLapse => "swap-after-lapse",
        /// The route view the swap answered with.
        SwapView => "swap-view",
        /// `DELETE /lock`.
        Release => "release",
        /// A write-phase read came back through the write region (`Server-Timing`).
        ReadThrough => "read-through",
        /// An instance showed the pre-lock within the declared delay + tolerance.
        ConvergenceDeclared => "convergence-declared",
        /// The timestamps of a lock view are in order.
        LockView => "lock-view",
        /// A positive `POST /lock/renew` extended the lease.
        RenewExtends => "renew-extends",
        /// A lease renewed past its cap (the pre-lock for a child lease, the maximum
        /// for the pre-lock) ends with the cap.
        RenewCapped => "renew-capped",
        /// `POST /lock` for longer than the service maximum.
        PreLockOverMax => "pre-lock-over-max",
        /// A check decided enough of the operations it meant to hold to a lock: no more
        /// than the configured share was inconclusive.
        Decided => "decided",
        /// `GET /lock/force-release`: the lock as an admin sees it (contract 1.4).
        ForceReleaseView => "force-release-view",
        /// `POST /lock/force-release`: one admin principal asks for the lock's removal.
        ForceReleaseRequest => "force-release-request",
        /// The requesting principal approves its own request (which must be refused).
        SelfApproval => "self-approval",
        /// `POST /lock/force-release/{request}/approve` by the other principal.
        ForceReleaseApprove => "force-release-approve",
    }
}

impl Op {
    /// Whether this is a user operation, judged against the enforcement table.
    pub fn is_user_op(self) -> bool {
        matches!(self, Op::Read | Op::Write | Op::Delete)
    }
}

impl From<UserOp> for Op {
    fn from(op: UserOp) -> Op {
        match op {
            UserOp::Read => Op::Read,
            UserOp::Write => Op::Write,
            UserOp::Delete => Op::Delete,
        }
    }
}

/// Generates [`Outcome`]: the outcomes the probe names itself (unit variants, one label
/// each) and the two that carry what a service said.
macro_rules! outcomes {
    ($($(#[$vmeta:meta])* $variant:ident => $label:literal,)+) => {
        /// What a check expected or observed.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum Outcome {
            $($(#[$vmeta])* $variant,)+
            /// An HTTP answer as `<status>[ <problem type>]` (`201`, `423 lock-held`): what
            /// a lock call or a route read gave.
            Reply(String),
            /// Any other words, such as a count (`2 winner(s)`).
            Other(String),
        }

        impl Outcome {
            /// Every outcome the probe names itself.
            pub const NAMED: &'static [Outcome] = &[$(Outcome::$variant,)+];

            /// The label: in reports, and in metrics where a bounded set is needed
            /// (expected outcomes, and observed ones that are enforcement decisions).
            pub fn as_str(&self) -> &str {
                match self {
                    $(Outcome::$variant => $label,)+
                    Outcome::Reply(s) | Outcome::Other(s) => s,
                }
            }

            /// The outcome whose label is `label` (the inverse of [`Outcome::as_str`]).
            pub fn from_label(label: &str) -> Option<Self> {
                Some(match label {
                    $($label => Outcome::$variant,)+
                    _ if is_reply(label) => Outcome::Reply(label.to_owned()),
                    _ => Outcome::Other(label.to_owned()),
                })
            }
        }
    };
}

/// Whether `label` starts with an HTTP status.
fn is_reply(label: &str) -> bool {
    let status = label.split(' ').next().unwrap_or_default();
    status.len() == 3 && status.bytes().all(|b| b.is_ascii_digit()) && !status.starts_with('0')
}

outcomes! {
    /// The enforcement table's allow.
    Allow => "allow",
    /// The enforcement table's block: 423 with `Retry-After`.
    Block => "block",
    /// A 423 that lacks the `Retry-After` the contract requires: still a block.
    BlockWithoutRetryAfter => "423 without Retry-After",
    /// The enforcement table's tombstone.
    Tombstone => "tombstone",
    /// No such item.
    Absent => "absent",
    /// The item is there with the value last written.
    Present => "present",
    /// The item is there with another value.
    WrongValue => "wrong-value",
    /// A deleted or tombstoned item has not come back.
    NotResurrected => "not-resurrected",
    /// A deleted or tombstoned item came back.
    Resurrected => "resurrected",
    /// The route view shows the lock.
    LockVisible => "lock-visible",
    /// The route view never showed the lock.
    NotVisible => "not-visible",
    /// The route view shows the new location and no lock.
    MovedUnlocked => "moved-unlocked",
    /// The route view shows the new location and still a lock.
    MovedStillLocked => "moved-still-locked",
    /// The route view still shows the old location.
    NotMoved => "not-moved",
    /// The lock was released (or had already lapsed).
    Released => "released",
    /// A lock view with a token.
    Token => "token",
    /// A success without the token it must carry.
    NoToken => "no token in lock view",
    /// A repeated pre-lock answered with the first one's token.
    SameToken => "same-token",
    /// A repeated pre-lock granted a second lock.
    FreshLock => "fresh-lock",
    /// A convergence delay was declared.
    Declared => "declared",
    /// No usable convergence delay was declared.
    Missing => "missing",
    /// The declared convergence delay is the configured one.
    AsConfigured => "as-configured",
    /// The declared convergence delay differs from the configured one.
    Mismatch => "mismatch",
    /// The target could not be reached.
    Unreachable => "unreachable",
    /// The probe refused to lock a resource outside the test prefix.
    RefusedOutsidePrefix => "refused-outside-prefix",
    /// Something other than the refusal expected.
    OtherOutcome => "other outcome",
    /// A renewal near the lease's end either took (200) or the service says the lease
    /// lapsed first (410): both are honest; what the writes around it got decides.
    RenewedOrLapsed => "renewed-or-lapsed",
    /// A read resolved through the write region.
    ReadThrough => "read-through",
    /// An answer without the `Server-Timing` route metric.
    NoServerTiming => "no Server-Timing",
    /// Visible within the declared delay + the measurement tolerance.
    WithinDeclared => "within-declared",
    /// Visible later than the declared delay + the measurement tolerance, or never.
    BeyondDeclared => "beyond-declared",
    /// A lock view's timestamps are in the contract's order.
    Consistent => "consistent",
    /// A lock view's timestamps are out of order, or missing.
    Inconsistent => "inconsistent",
    /// A renewal moved the lease's end later.
    Extended => "extended",
    /// A renewal left the lease's end where it was, or moved it earlier.
    NotExtended => "not-extended",
    /// A child lease ends with the pre-lock (or the maximum), not later.
    CappedAtParent => "capped-at-parent",
    /// A child lease ends after the pre-lock or the maximum.
    OutlivesParent => "outlives-parent",
    /// A child lease renewed past the pre-lock ends before it.
    ShortOfParent => "short-of-parent",
    /// A pre-lock renewed past the maximum ends with it.
    CappedAtMaximum => "capped-at-maximum",
    /// A pre-lock renewed past the maximum ends after it.
    PastMaximum => "past-maximum",
    /// A pre-lock renewed past the maximum ends before it.
    ShortOfMaximum => "short-of-maximum",
    /// A check held enough of its operations to the lock to reach a verdict.
    Decided => "decided",
    /// A check left more of its operations undecided than allowed.
    Inconclusive => "inconclusive",
    /// The admin view shows the check's own lock, in the phase it holds.
    OwnLock => "own-lock",
    /// The admin view shows no lock, another one, or one in another phase.
    NotOwnLock => "not-own-lock",
}

impl Outcome {
    /// `200`.
    pub fn ok() -> Self {
        Self::reply(200, None)
    }

    /// `201`.
    pub fn created() -> Self {
        Self::reply(201, None)
    }

    /// `423 lock-held`.
    pub fn lock_held() -> Self {
        Self::reply(423, Some("lock-held"))
    }

    /// `409 token-mismatch`.
    pub fn token_mismatch() -> Self {
        Self::reply(409, Some("token-mismatch"))
    }

    /// `409 invalid-transition`.
    pub fn invalid_transition() -> Self {
        Self::reply(409, Some("invalid-transition"))
    }

    /// `400 bad-request`.
    pub fn bad_request() -> Self {
        Self::reply(400, Some("bad-request"))
    }

    /// `410 lock-expired`.
    pub fn lock_expired() -> Self {
        Self::reply(410, Some("lock-expired"))
    }

    /// `410 lock-force-released`: the old holder's token after a force-release.
    pub fn lock_force_released() -> Self {
        Self::reply(410, Some("lock-force-released"))
    }

    /// `403 self-approval`.
    pub fn self_approval() -> Self {
        Self::reply(403, Some("self-approval"))
    }

    /// An HTTP answer: `201`, or `423 lock-held` with its problem type.
    pub fn reply(status: u16, problem: Option<&str>) -> Self {
        Self::Reply(match problem {
            Some(p) => format!("{status} {p}"),
            None => status.to_string(),
        })
    }

    /// How many of the concurrent pre-locks were granted.
    pub fn winners(n: usize) -> Self {
        Self::Other(format!("{n} winner(s)"))
    }

    /// The enforcement decision this outcome stands for, if it stands for one: a 423
    /// without `Retry-After` is still a block.
    pub fn decision(&self) -> Option<Outcome> {
        match self {
            Outcome::Allow | Outcome::Block | Outcome::Tombstone => Some(self.clone()),
            Outcome::BlockWithoutRetryAfter => Some(Outcome::Block),
            _ => None,
        }
    }
}

labelled!(Outcome);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        for p in Phase::ALL {
            assert_eq!(Phase::from_label(p.as_str()), Some(*p));
        }
        for op in Op::ALL {
            assert_eq!(Op::from_label(op.as_str()), Some(*op));
        }
        for o in Outcome::NAMED {
            assert_eq!(Outcome::from_label(o.as_str()).as_ref(), Some(o));
        }
        for o in [Outcome::created(), Outcome::lock_held(), Outcome::reply(500, Some("internal")), Outcome::winners(2)]
        {
            assert_eq!(Outcome::from_label(o.as_str()), Some(o.clone()));
        }
        assert_eq!(Outcome::lock_held().as_str(), "423 lock-held");
        assert_eq!(Outcome::winners(1).as_str(), "1 winner(s)");
        assert_eq!(serde_json::to_value(Phase::HardDelete).unwrap(), "hardDelete");
        assert_eq!(serde_json::from_value::<Outcome>("block".into()).unwrap(), Outcome::Block);
    }

    #[test]
    fn user_ops_are_the_ops_the_enforcement_table_judges() {
        for op in UserOp::ALL {
            assert!(Op::from(*op).is_user_op());
            assert_eq!(Op::from(*op).as_str(), op.as_str());
        }
        assert_eq!(Op::ALL.iter().filter(|o| o.is_user_op()).count(), UserOp::ALL.len());
    }

    #[test]
    fn a_block_without_retry_after_is_still_a_block() {
        assert_eq!(Outcome::BlockWithoutRetryAfter.decision(), Some(Outcome::Block));
        assert_eq!(Outcome::lock_held().decision(), None);
        assert_eq!(Outcome::Absent.decision(), None);
    }
}
