//! One probe cycle: the main migration walk (seed, pre-lock and convergence, hardDelete,
//! write lock, swap) on one test resource, and every negative check on its own resource.
//! Every check is an [`Assertion`]; a deviation fails that assertion and never panics the
//! probe; every path out of a check releases the lock it holds.
//!
//! `check` holds the per-resource helpers (assertions, lock bookkeeping, release),
//! `walk` the main migration walk, `negative` the refusals the service must make,
//! `eager` the checks that act at the first instant allowed, and `force_release` the
//! two-principal removal of a lock (when the target has admin keys).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use check::Check;
use eager::Eager;
#[cfg(test)]
pub(crate) use eager::RENEWAL_LEASE as EAGER_RENEWAL_LEASE;
use negative::Negative;

use super::observer::Observer;
use super::report::{
    Assertion, CheckDecisions, CycleReport, CycleResult, InstanceConvergence, InstanceVersions, StepStart, WalkTimeline,
};
use super::settings::{AdminKeys, ProbeSettings, RESOURCES_PER_CYCLE};
use super::state::{HeldLock, PreLockIntent, StateError, StateFile};
use super::target::{CallKey, Declared, HttpClients, TargetClient, TargetError};
use super::vocabulary::{Op, Outcome, Phase};
use window::Tally;

/// What repeating an unanswered pre-lock found.
enum Recovered {
    /// It was granted: this token holds the lock.
    Token(String),
    /// There is nothing of ours to release.
    Nothing,
    /// The service did not say; keep the journal entry and try again later.
    Unknown,
}

/// Why a check stopped early.
#[derive(Debug)]
enum Abort {
    /// A lock operation did not give what the rest of the check needs (already asserted).
    Stop,
    /// The target could not be reached (already asserted).
    Transport(String),
    /// Timeout or shutdown.
    Cancelled,
    /// The state file refused the pre-lock's intent, so the pre-lock was not sent: a
    /// lock the journal does not hold would outlive a restart.
    Journal(String),
}

impl Abort {
    /// Why a pre-lock was not sent, for the cycle's `error`.
    fn journal(resource: &str, e: &StateError) -> Self {
        Abort::Journal(format!(
            "the pre-lock of {resource} was not sent: its intent could not be recorded in the state file, \
             and a lock the state file does not hold would not be released after a restart ({e})"
        ))
    }
}

/// What claiming a group of resources for one cycle gave. `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub enum Claim {
    /// This replica holds the group until it gives the claim back.
    Held {
        /// The lock's resource.
        resource: String,
        /// Its token.
        token: String,
    },
    /// Another replica holds it: try another group.
    Busy,
    /// The claim could not be asked for (the target is down): the cycle runs anyway and
    /// reports what it finds, rather than hiding an outage behind a skipped cycle.
    Unavailable,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::Held { resource, .. } => f.debug_struct("Held").field("resource", resource).finish_non_exhaustive(),
            Claim::Busy => f.write_str("Busy"),
            Claim::Unavailable => f.write_str("Unavailable"),
        }
    }
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
    read_through_client: Mutex<Vec<f64>>,
    phases: Mutex<Vec<(Phase, f64)>>,
    declared: Mutex<Option<f64>>,
    convergence: Mutex<Vec<InstanceConvergence>>,
    notes: Mutex<Vec<String>>,
    /// The main walk's steps as they began, by the probe's wall clock.
    steps: Mutex<Vec<(Phase, DateTime<Utc>)>>,
    /// What the main walk waited after the pre-lock's answer before escalating.
    escalation_wait: Mutex<Option<f64>>,
    /// Per check: the phase of the first operation it meant to hold to a lock, and how
    /// many it held and could not hold.
    tallies: Mutex<BTreeMap<String, (Phase, Tally)>>,
}

/// The name of the main walk's check (the negative checks are named after themselves).
const MAIN_CHECK: &str = "cycle";

/// Every check a cycle may run, by the name reports and metrics give it.
pub fn checks() -> impl Iterator<Item = &'static str> {
    std::iter::once(MAIN_CHECK)
        .chain(Negative::ALL.into_iter().map(Negative::name))
        .chain(Eager::ALL.into_iter().map(Eager::name))
        .chain(std::iter::once(force_release::NAME))
}

/// The resource the force-release check of a cycle whose main resource is `main` runs
/// on (named after it, so a pool needs no more resources for the check).
pub fn force_release_resource(main: &str) -> String {
    force_release::resource_of(main)
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
        let client = TargetClient::with_tls(
            &settings.instances,
            &settings.api_key,
            &settings.test_prefix,
            settings.request_timeout,
            &settings.tls,
        )?;
        Ok(Self { settings, client, state, observer })
    }

    /// [`Scenario::new`] on the HTTP client `clients` keeps for the target's TLS
    /// configuration, shared with the other targets that have the same one.
    pub fn sharing(
        settings: ProbeSettings,
        clients: &HttpClients,
        state: Arc<StateFile>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, TargetError> {
        let client = TargetClient::sharing(
            clients.client(&settings.tls)?,
            &settings.tls,
            &settings.instances,
            &settings.api_key,
            &settings.test_prefix,
            settings.request_timeout,
        );
        Ok(Self { settings, client, state, observer })
    }

    /// The target's settings.
    pub fn settings(&self) -> &ProbeSettings {
        &self.settings
    }

    /// Releases locks a previous run recorded for this target and did not release.
    /// Returns how many entries were cleared.
    ///
    /// Bounded by [`Self::recovery_deadline`]: a target whose instances accept
    /// connections and never answer must not hold its schedule back for long. What is
    /// not cleared by then stays in the state file, and a cycle retries it before it
    /// reuses the resource.
    pub async fn recover(&self) -> usize {
        let entries = self.state.entries_of(&self.settings.name).len();
        if entries == 0 {
            return 0;
        }
        let cleared = std::sync::atomic::AtomicUsize::new(0);
        let deadline = self.recovery_deadline(entries);
        let counted = async {
            let n = self.recover_where(|_| true).await;
            cleared.store(n, std::sync::atomic::Ordering::Relaxed);
        };
        if tokio::time::timeout(deadline, counted).await.is_err() {
            tracing::warn!(
                target_name = %self.settings.name,
                entries,
                deadline = ?deadline,
                "releasing the locks a previous run left did not finish in time; what is left is retried before each cycle reuses its resources"
            );
        }
        cleared.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How long releasing `entries` left-over locks may take: each takes a release, and
    /// an unanswered pre-lock a replay first, each bounded by the request timeout and
    /// repeated while its outcome is unknown; four request timeouts each.
    pub fn recovery_deadline(&self, entries: usize) -> Duration {
        let per_entry = self.settings.request_timeout.saturating_mul(4);
        per_entry.saturating_mul(u32::try_from(entries.max(1)).unwrap_or(u32::MAX))
    }

    /// Releases left-over locks on `resources` only (a cycle's own resources: other
    /// running cycles' entries must not be touched).
    pub(super) async fn recover_resources(&self, resources: &[String]) -> usize {
        self.recover_where(|r| resources.iter().any(|x| x == r)).await
    }

    async fn recover_where(&self, wanted: impl Fn(&str) -> bool) -> usize {
        let mut cleared = 0;
        for held in self.state.entries_of(&self.settings.name) {
            if !wanted(&held.resource) {
                continue;
            }
            let token = match held.token.clone() {
                Some(token) => token,
                None => match self.token_of_unanswered_pre_lock(&held).await {
                    Recovered::Token(token) => token,
                    Recovered::Nothing => {
                        let _ = self.state.forget(&held.target, &held.resource);
                        cleared += 1;
                        continue;
                    }
                    Recovered::Unknown => continue,
                },
            };
            let c = &self.client;
            let send = |k| c.release(0, &held.resource, &token, k);
            match c.until_known(&CallKey::fresh(), send).await {
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

    /// Claims a group of pool resources for one cycle, against other replicas of this
    /// probe running the same configuration: a pre-lock on the group's claim resource
    /// (`<first resource>-claim`), journaled like any pre-lock so a replica killed while
    /// holding it releases it on restart. `423` means another replica holds the group.
    pub async fn claim_group(&self, group: &[String], lease: Duration) -> Claim {
        let Some(first) = group.first() else { return Claim::Unavailable };
        let resource = format!("{first}-claim");
        let s = &self.settings;
        let key = CallKey::fresh();
        let intent = PreLockIntent {
            key: key.as_str().to_owned(),
            owner: s.owner.clone(),
            duration_seconds: lease.as_secs_f64(),
            target_location: None,
        };
        if let Err(e) = self.state.record_intent(&s.name, &resource, Some(intent)) {
            // Not sent: the cycle runs and ends at its own first pre-lock, which the
            // state file refuses too, with the reason in its report.
            tracing::error!(error = %e, %resource, "the group's claim was not sent: its intent could not be recorded in the state file");
            return Claim::Unavailable;
        }
        let c = &self.client;
        let send = |k| c.pre_lock(0, &resource, &s.owner, lease, None, k);
        match c.until_known(&key, send).await {
            Ok(r) if (200..300).contains(&r.status) => match r.str_field("token") {
                Some(token) => {
                    if let Err(e) = self.state.record_token(&s.name, &resource, token) {
                        tracing::warn!(error = %e, "cannot record claim token in state file");
                    }
                    Claim::Held { resource, token: token.to_owned() }
                }
                None => {
                    let _ = self.state.forget(&s.name, &resource);
                    Claim::Unavailable
                }
            },
            Ok(r) if r.status == 423 => {
                let _ = self.state.forget(&s.name, &resource);
                Claim::Busy
            }
            Ok(r) => {
                tracing::warn!(target_name = %s.name, %resource, status = r.status, "could not claim test resources; running the cycle anyway");
                if (400..500).contains(&r.status) {
                    let _ = self.state.forget(&s.name, &resource);
                }
                Claim::Unavailable
            }
            Err(e) => {
                tracing::warn!(target_name = %s.name, %resource, error = %e, "could not claim test resources; running the cycle anyway");
                Claim::Unavailable
            }
        }
    }

    /// Gives back a claim taken by [`Scenario::claim_group`].
    pub async fn release_claim(&self, claim: Claim) {
        let Claim::Held { resource, token } = claim else { return };
        let c = &self.client;
        let send = |k| c.release(0, &resource, &token, k);
        match c.until_known(&CallKey::fresh(), send).await {
            Ok(r) if matches!(r.status, 204 | 409 | 410) => {
                let _ = self.state.forget(&self.settings.name, &resource);
            }
            // Kept in the state file: the next start (or the lease) ends it.
            Ok(r) => tracing::warn!(%resource, status = r.status, "could not release the claim on test resources"),
            Err(e) => tracing::warn!(%resource, error = %e, "could not release the claim on test resources"),
        }
    }

    /// The token of a pre-lock whose answer never arrived (the probe was cancelled or
    /// killed while it was in flight): the journaled request, repeated under its key,
    /// returns the token it was granted, if it was granted and still holds.
    async fn token_of_unanswered_pre_lock(&self, held: &HeldLock) -> Recovered {
        let Some(intent) = &held.pre_lock else {
            tracing::warn!(target_name = %held.target, resource = %held.resource, "left-over pre-lock intent without a key, its lease will end it");
            return Recovered::Nothing;
        };
        let c = &self.client;
        let lease = Duration::try_from_secs_f64(intent.duration_seconds).unwrap_or_default();
        let key = CallKey::from_journal(intent.key.clone());
        let target = intent.target_location.as_deref();
        let send = |k| c.pre_lock(0, &held.resource, &intent.owner, lease, target, k);
        match c.until_known(&key, send).await {
            Ok(r) if (200..300).contains(&r.status) => match r.str_field("token") {
                Some(token) => {
                    tracing::info!(target_name = %held.target, resource = %held.resource, "recovered the token of an unanswered pre-lock");
                    Recovered::Token(token.to_owned())
                }
                None => Recovered::Nothing,
            },
            // Never granted, or granted and already gone: nothing to release.
            Ok(r) if matches!(r.status, 409 | 410) => Recovered::Nothing,
            Ok(r) if r.status == 423 => {
                // Someone else's lock, or a service that ignores the key (contract 1.0):
                // either way not ours to release; its lease ends it.
                tracing::warn!(target_name = %held.target, resource = %held.resource, "an unanswered pre-lock cannot be recovered (423); its lease will end it");
                Recovered::Nothing
            }
            Ok(r) => {
                tracing::warn!(target_name = %held.target, resource = %held.resource, status = r.status, "could not learn the outcome of an unanswered pre-lock");
                Recovered::Unknown
            }
            Err(e) => {
                tracing::warn!(target_name = %held.target, resource = %held.resource, error = %e, "could not learn the outcome of an unanswered pre-lock");
                Recovered::Unknown
            }
        }
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
        assert!(resources.len() >= RESOURCES_PER_CYCLE, "a cycle needs {RESOURCES_PER_CYCLE} resources");
        let started_at = Utc::now();
        // Changes seen before this cycle belong to no cycle's report.
        let _ = self.client.take_store_region_changes();
        let force_release =
            self.settings.force_release.as_ref().map(|keys| (keys, force_release::resource_of(&resources[0])));
        // A release that failed last time (target unreachable) is retried before reuse.
        let mut own: Vec<String> = resources.to_vec();
        own.extend(force_release.iter().map(|(_, r)| r.clone()));
        self.recover_resources(&own).await;
        let rec = Recorder::default();
        let main = Check::new(self, &rec, MAIN_CHECK, &resources[0]);
        let main_out = main.guarded(&cancel, main.walk()).await;
        let walk_ended = Utc::now();

        let checks: Vec<(Negative, Check<'_>)> = Negative::ALL
            .into_iter()
            .zip(&resources[1..])
            .enumerate()
            .map(|(i, (n, resource))| (n, Check::new(self, &rec, n.name(), resource).starting_at(i + 1)))
            .collect();
        let eager_resources = resources.get(RESOURCES_PER_CYCLE..).unwrap_or_default();
        let eager: Vec<(Eager, Check<'_>)> = if self.settings.eager {
            Eager::ALL.into_iter().zip(eager_resources).map(|(e, r)| (e, Check::new(self, &rec, e.name(), r))).collect()
        } else {
            Vec::new()
        };
        let force: Option<(&AdminKeys, Check<'_>)> = force_release.as_ref().map(|(keys, resource)| {
            (*keys, Check::new(self, &rec, force_release::NAME, resource).starting_at(Negative::ALL.len() + 1))
        });
        let outs = if matches!(main_out, Err(Abort::Cancelled | Abort::Transport(_) | Abort::Journal(_))) {
            Vec::new()
        } else {
            let negatives = futures::future::join_all(checks.iter().map(|(n, c)| async {
                let out = c.guarded(&cancel, c.negative(*n)).await;
                self.observer.check_finished(&self.settings.name, &c.name);
                out
            }));
            let eagers = futures::future::join_all(eager.iter().map(|(e, c)| async {
                let out = c.guarded(&cancel, c.eager(*e)).await;
                self.observer.check_finished(&self.settings.name, &c.name);
                out
            }));
            let forced = async {
                let (keys, c) = force.as_ref()?;
                let out = c.guarded(&cancel, c.force_release(keys)).await;
                self.observer.check_finished(&self.settings.name, &c.name);
                Some(out)
            };
            let (mut outs, eager_outs, forced) = tokio::join!(negatives, eagers, forced);
            outs.extend(eager_outs);
            outs.extend(forced);
            outs
        };

        let mut error = None;
        for out in std::iter::once(&main_out).chain(outs.iter()) {
            match out {
                Err(Abort::Transport(m)) => error = Some(format!("target unreachable: {m}")),
                Err(Abort::Cancelled) => error = Some("cycle cancelled (timeout or shutdown)".into()),
                Err(Abort::Journal(m)) => error = Some(m.clone()),
                _ => {}
            }
        }
        let decisions = self.decide_checks(&rec);
        let assertions = std::mem::take(&mut *lock(&rec.assertions));
        let result = if error.is_some() {
            CycleResult::Error
        } else if assertions.iter().any(Assertion::failed) {
            CycleResult::Failed
        } else {
            CycleResult::Passed
        };
        let mut report = CycleReport {
            target: self.settings.name.clone(),
            resource: resources[0].clone(),
            started_at,
            finished_at: Utc::now(),
            result,
            error,
            assertions,
            phase_durations: std::mem::take(&mut *lock(&rec.phases)),
            read_through_seconds: std::mem::take(&mut *lock(&rec.read_through)),
            read_through_client_seconds: std::mem::take(&mut *lock(&rec.read_through_client)),
            declared_convergence_seconds: *lock(&rec.declared),
            expected_convergence_seconds: self.settings.expected_convergence.map(|d| d.as_secs_f64()),
            observed_convergence: std::mem::take(&mut *lock(&rec.convergence)),
            notes: std::mem::take(&mut *lock(&rec.notes)),
            store_region_changes: Vec::new(),
            declared_versions: Vec::new(),
            walk: walk_timeline(&rec, started_at, walk_ended),
            decisions,
        };
        let declared = self.client.declared_versions();
        let distinct: std::collections::BTreeSet<&Declared> = declared.values().collect();
        if distinct.len() > 1 {
            let each: Vec<String> = declared.iter().map(|(instance, d)| format!("{instance}: {d}")).collect();
            report.notes.push(format!(
                "the instances answer as different versions (a mixed fleet, as in a rollout): {}",
                each.join("; ")
            ));
        }
        report.declared_versions = declared
            .into_iter()
            .map(|(instance, d)| InstanceVersions { instance, contract: d.contract, library: d.library })
            .collect();
        let moves = self.client.take_store_region_changes();
        if !moves.is_empty() {
            let moves: Vec<String> = moves.iter().map(ToString::to_string).collect();
            report.notes.push(format!(
                "the service's store region changed during this cycle ({}): a failover; failures in this cycle may be the failover's",
                moves.join(", ")
            ));
            report.store_region_changes = moves;
        }
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
        self.observer.cycle_finished(&report);
        report
    }
}

impl Scenario {
    /// Each check's decisions over its operations held to a lock; a check that left
    /// more of them inconclusive than [`ProbeSettings::max_inconclusive`] allows gets a
    /// failed `decided` assertion (it cannot pass by deciding nothing).
    fn decide_checks(&self, rec: &Recorder) -> Vec<CheckDecisions> {
        let cap = self.settings.max_inconclusive;
        let tallies = std::mem::take(&mut *lock(&rec.tallies));
        let mut decisions = Vec::new();
        for (check, (phase, tally)) in tallies {
            let share = tally.share();
            let decided = share <= cap;
            let all = tally.held + tally.inconclusive;
            let detail = format!(
                "{} of {all} operations held to the lock were inconclusive ({:.0}%, at most {:.0}% allowed){}{}",
                tally.inconclusive,
                share * 100.0,
                cap * 100.0,
                match tally.retried {
                    0 => String::new(),
                    n => format!("; {n} made again after they could not be held to it"),
                },
                if tally.reasons.is_empty() { String::new() } else { format!(": {}", tally.reasons.join("; ")) }
            );
            let a = Assertion {
                check: check.clone(),
                phase,
                op: Op::Decided,
                instance: None,
                expected: Outcome::Decided,
                observed: if decided { Outcome::Decided } else { Outcome::Inconclusive },
                passed: decided,
                at: Utc::now(),
                duration: Duration::ZERO,
                detail: Some(detail),
                inconclusive: None,
            };
            self.observer.assertion(&self.settings.name, &a);
            lock(&rec.assertions).push(a);
            decisions.push(CheckDecisions {
                check,
                held: tally.held,
                inconclusive: tally.inconclusive,
                reasons: tally.reasons,
                retried: tally.retried,
            });
        }
        decisions
    }
}

/// The main walk's steps and end, in seconds from the cycle's start.
fn walk_timeline(rec: &Recorder, started_at: DateTime<Utc>, ended: DateTime<Utc>) -> WalkTimeline {
    let since_start = |t: DateTime<Utc>| (t - started_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
    WalkTimeline {
        steps: lock(&rec.steps)
            .iter()
            .map(|(phase, at)| StepStart { phase: *phase, at_seconds: since_start(*at) })
            .collect(),
        ended_seconds: Some(since_start(ended)),
        escalation_wait_seconds: *lock(&rec.escalation_wait),
    }
}

mod check;
mod eager;
mod force_release;
mod negative;
mod walk;
mod window;

#[cfg(test)]
mod tests;
