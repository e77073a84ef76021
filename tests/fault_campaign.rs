//! The seeded fault campaign: orchestrators migrating a few resources while users read,
//! write and delete on every instance, all through the reference service's handlers,
//! with random store faults at every step (slow, late-acknowledged, ambiguous, lost and
//! failed writes and reads, replica lag within the declared bound) and one instance's
//! clock skewed within the skew margin, judged by the oracle (`support/oracle.rs`).
//!
//! Inside the scheme's assumptions the oracle must find nothing, seed after seed; with a
//! legacy behaviour switched back on it must find the hole within 1,000 seeds.
//!
//! On the two-region test account (docs/cosmos-regions.md) a failover is made in the
//! middle of each lifecycle step in turn, with user traffic on every instance and each
//! instance on a Cosmos store of its own that must discover the new write region.
//!
//! Every pre-lock an orchestrator was granted is repeated under its idempotency key at
//! the end of its run, after every later lock call of the seed on that resource: inside the key's window (contract 1.3) a repeat gets the first call's
//! lock while it lives, 409 once released, 410 once lapsed, and never a fresh lock.
//!
//! With an operator (`force_releases_under_store_faults_break_nothing`), two admin
//! principals force-release live locks at random moments (contract 1.4) while their
//! holders go on, under the same store faults (the approval's write late, ambiguous,
//! lost or failed like any other): both oracles must still find nothing.
//!
//! `LOCKPROBE_CAMPAIGN_SEEDS=N` runs N seeds instead of the suite's 1,000 (figures for
//! RELIABILITY.md); `LOCKPROBE_CAMPAIGN_FIRST_SEED` moves the window;
//! `LOCKPROBE_FORCE_RELEASE_SEEDS=N` sizes the operator's campaign (default 200).

#[path = "support/contract_oracle.rs"]
mod contract_oracle;
#[path = "support/cosmos_server.rs"]
mod cosmos_server;
#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/oracle.rs"]
mod oracle;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use contract_oracle::{Call, Exchange};
use fleet::{Answer, Fleet, FleetOptions, PerInstance};
use lockprobe::clock::TokioClock;
use lockprobe::routing::Phase;
use lockprobe::service::{Fault, LockDesign};
use lockprobe::store::{LocationStore, OpKind};
use lockprobe::testing::{in_step, FaultAction, FaultKind, FaultRule, FaultStats, OpSet};
use oracle::{Evidence, Final, Holding, Op, UserOp, Violation};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const RESOURCES: [&str; 3] = ["r0", "r1", "r2"];
const LOCATIONS: [&str; 2] = ["westeurope", "northeurope"];
const ORCHESTRATORS: usize = 3;
const USERS: usize = 3;
const KEYS_PER_USER: usize = 3;

/// How long a seed runs.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// How long the orchestrators and users act.
    active: Duration,
    /// The pre-locks' lease, seconds.
    pre_lock_lease: f64,
    /// How long everything is left to settle before the items are read back: every
    /// lease and cache has run out by then.
    settle: Duration,
}

/// On the memory store, in paused (virtual) time.
const MEMORY: Shape = Shape { active: Duration::from_secs(15), pre_lock_lease: 20.0, settle: Duration::from_secs(60) };

/// On the memory store, six times as long: enough lock calls on one resource to pass
/// contract 1.1's 16 records.
const MEMORY_LONG: Shape = Shape { active: Duration::from_secs(90), ..MEMORY };

/// On the local Cosmos DB server, in real time: shorter.
const COSMOS: Shape = Shape { active: Duration::from_secs(12), pre_lock_lease: 10.0, settle: Duration::from_secs(16) };

const TTL: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_millis(500);
const MARGIN: Duration = Duration::from_millis(500);
const DECISION_AGE: Duration = Duration::from_millis(500);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What one seed did and what the oracle found.
#[derive(Debug, Default)]
struct SeedReport {
    /// What the first oracle (the store's history, settled by the library) found.
    violations: Vec<Violation>,
    /// What the second oracle (the exchanges alone, by the contract) found.
    contract_violations: Vec<Violation>,
    /// Exchanges the second oracle judged.
    exchanges: usize,
    user_ops: usize,
    lock_calls: usize,
    migrations_swapped: usize,
    /// Force-releases approved (200), and approvals left unknown.
    force_released: usize,
    /// Pre-locks repeated under their key, by answer.
    replays: Replays,
    faults: FaultStats,
    /// Faults injected, by the phase the resource was in.
    by_phase: BTreeMap<(&'static str, FaultKind), u64>,
    skew_ms: i64,
    /// The failover made, if the seed had a plan and its step came.
    failover: Option<cosmos_server::FailoverRecord>,
}

/// What the fleet's actors record for the oracle.
#[derive(Default)]
struct Log {
    ops: Vec<UserOp>,
    /// Every request and answer, for the second oracle.
    exchanges: Vec<Exchange>,
    holdings: Vec<Holding>,
    known: HashSet<String>,
    lock_calls: usize,
    swapped: usize,
    replays: Replays,
    /// Locks an operator's approval may have removed: (fingerprint, the approval's first
    /// sending); the first oracle's holdings of those tokens end there.
    force_released: Vec<(String, DateTime<Utc>)>,
}

/// Repeated pre-locks (contract 1.3, "How long a key is honoured"): how they were
/// answered, and every answer the contract does not allow inside the key's window.
#[derive(Debug, Default, Clone)]
struct Replays {
    /// 201 with the token the first call was granted.
    same_lock: usize,
    /// 409 `token-mismatch`: the lock was released or swapped.
    released: usize,
    /// 410 `lock-expired`: the lock lapsed.
    lapsed: usize,
    /// 410 `lock-force-released`: an operator removed the lock (contract 1.4).
    force_released: usize,
    /// 429 or 503: refused for now, nothing decided.
    deferred: usize,
    /// A fresh lock, or any other answer.
    violations: Vec<Violation>,
}

impl Replays {
    fn add(&mut self, other: &Replays) {
        self.same_lock += other.same_lock;
        self.released += other.released;
        self.lapsed += other.lapsed;
        self.force_released += other.force_released;
        self.deferred += other.deferred;
        self.violations.extend(other.violations.iter().cloned());
    }

    fn total(&self) -> usize {
        self.same_lock + self.released + self.lapsed + self.force_released + self.deferred + self.violations.len()
    }
}

type Shared = Arc<Mutex<Log>>;

/// One request as its caller saw it, for the second oracle.
#[allow(clippy::too_many_arguments)]
fn exchange(
    actor: String,
    resource: &str,
    call: Call,
    (token, key): (Option<&str>, Option<&str>),
    sent: DateTime<Utc>,
    answered: DateTime<Utc>,
    answer: &Answer,
) -> Exchange {
    Exchange {
        actor,
        resource: resource.to_owned(),
        call,
        token: token.map(str::to_owned),
        key: key.map(str::to_owned),
        sent,
        answered,
        status: answer.status,
        body: answer.body.clone(),
        route: answer.route.clone(),
    }
}

fn log(shared: &Shared) -> std::sync::MutexGuard<'_, Log> {
    shared.lock().unwrap()
}

/// The kinds of store fault the campaign injects: every kind the store can fail in on
/// its own. (`lost-race` stands in for a concurrent writer, which the campaign has real
/// ones of.)
const CAMPAIGN_FAULTS: [FaultKind; 6] = [
    FaultKind::Delay,
    FaultKind::LateAck,
    FaultKind::Ambiguous,
    FaultKind::LateCommit,
    FaultKind::Fail,
    FaultKind::ReplicaLag,
];

/// The store faults of one seed: every kind of [`CAMPAIGN_FAULTS`], with parameters
/// drawn from the seed.
fn fault_rules(rng: &mut StdRng) -> Vec<FaultRule> {
    let d = |rng: &mut StdRng, lo: u64, hi: u64| ms(rng.random_range(lo..=hi));
    let writes = OpSet::WRITES;
    let reads = OpSet::READS;
    let mut rules = vec![
        // Replica lag on top of a store whose replicas are otherwise current: within the bound.
        FaultRule::new(OpKind::ReadReplica, FaultAction::ReplicaLag(d(rng, 50, BOUND.as_millis() as u64)))
            .probability(0.2),
        FaultRule::new(writes, FaultAction::Delay(d(rng, 100, 3_000))).probability(0.04),
        FaultRule::new(writes, FaultAction::LateAck(d(rng, 100, 1_000))).probability(0.04),
        FaultRule::new(writes, FaultAction::Ambiguous).probability(0.03),
        FaultRule::new(writes, FaultAction::Fail).probability(0.03),
        FaultRule::new(reads, FaultAction::Delay(d(rng, 20, 800))).probability(0.02),
        FaultRule::new(reads, FaultAction::LateAck(d(rng, 20, 800))).probability(0.02),
        FaultRule::new(reads, FaultAction::Ambiguous).probability(0.01),
        FaultRule::new(reads, FaultAction::Fail).probability(0.02),
    ];
    let commit_after = d(rng, 200, 3_000);
    let timeout = d(rng, 100, 1_500);
    rules.push(FaultRule::new(writes, FaultAction::LateCommit { commit_after, timeout }).probability(0.04));
    rules
}

/// Where a seed's routing documents live.
enum Backend {
    /// A fresh in-memory store on the fleet's paused clock.
    Memory,
    /// This store (a fresh Cosmos DB database), with true time the real time.
    Given(Arc<dyn LocationStore>),
}

/// A failover of the two-region account, made once, when an orchestrator first sends
/// a call of `step` (the failover and the call then run at the same time).
struct FailoverPlan {
    regions: Arc<cosmos_server::CosmosRegions>,
    step: &'static str,
    mode: cosmos_server::Failover,
    task: Mutex<Option<tokio::task::JoinHandle<cosmos_server::FailoverRecord>>>,
    fired: std::sync::atomic::AtomicBool,
    /// The replication lag set once the failover is made (the old write region, now a
    /// replica, then lags this far behind the new one).
    lag_after: Option<Duration>,
    /// Whether the failover waits for the call's acknowledgement (so a forced failover
    /// can lose what the call committed) instead of starting when the call is sent.
    after_ack: bool,
}

impl FailoverPlan {
    fn new(regions: Arc<cosmos_server::CosmosRegions>, step: &'static str, mode: cosmos_server::Failover) -> Self {
        Self {
            regions,
            step,
            mode,
            task: Mutex::new(None),
            fired: Default::default(),
            lag_after: None,
            after_ack: false,
        }
    }

    /// Makes the failover right after the step's first acknowledged call.
    fn after_ack(mut self) -> Self {
        self.after_ack = true;
        self
    }

    /// Sets the replication lag to `lag` once the failover is made.
    fn then_lag(mut self, lag: Duration) -> Self {
        self.lag_after = Some(lag);
        self
    }

    /// Starts the failover if `step` is the plan's and it has not been made yet.
    fn at(&self, step: &'static str) {
        if step == self.step && !self.fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let (regions, mode, lag_after) = (self.regions.clone(), self.mode, self.lag_after);
            *self.task.lock().unwrap() = Some(tokio::spawn(async move {
                let record = regions.failover(mode).await;
                if let Some(lag) = lag_after {
                    regions.set_lag(lag).await;
                }
                record
            }));
        }
    }

    /// The failover made, once it finished (none if the step never came).
    async fn record(&self) -> Option<cosmos_server::FailoverRecord> {
        let task = self.task.lock().unwrap().take();
        match task {
            Some(task) => Some(task.await.expect("the failover request panicked")),
            None => None,
        }
    }
}

/// Runs one seed to the end and judges it.
async fn run_seed(seed: u64, legacy: &[Fault], backend: Backend, shape: Shape) -> SeedReport {
    run_seed_with(seed, legacy, backend, shape, None, false).await
}

/// Like [`run_seed`]; with a failover plan, the failover is the seed's only fault.
async fn run_seed_with(
    seed: u64,
    legacy: &[Fault],
    backend: Backend,
    shape: Shape,
    failover: Option<Arc<FailoverPlan>>,
    operator: bool,
) -> SeedReport {
    let mut rng = StdRng::seed_from_u64(seed);
    // One instance runs off true time by up to the skew margin, either way.
    let skew_ms = rng.random_range(-(MARGIN.as_millis() as i64) + 50..=MARGIN.as_millis() as i64 - 50);
    let skewed = rng.random_range(0..2);
    let mut skews = vec![TimeDelta::zero(); 2];
    skews[skewed] = TimeDelta::milliseconds(skew_ms);
    let opts = FleetOptions {
        skews,
        ttl: TTL,
        bound: BOUND,
        replica_lag: Duration::ZERO,
        skew_margin: MARGIN,
        decision_age: DECISION_AGE,
        faults: legacy.to_vec(),
        seed,
        lock_design: LockDesign::Embedded,
    };
    // A given store (the local Cosmos server) runs the fleet on real time, not paused.
    let real_time = matches!(backend, Backend::Given(_));
    let fleet = Arc::new(match backend {
        Backend::Memory => Fleet::new(opts),
        Backend::Given(store) => Fleet::over(opts, store, Arc::new(TokioClock::new(Utc::now()))),
    });
    let rules = fault_rules(&mut rng);
    if failover.is_none() {
        for rule in rules {
            fleet.store.add_rule(rule);
        }
    }
    let shared: Shared = Arc::default();
    let deadline = fleet.now() + to_delta(shape.active);
    let mut tasks = Vec::new();
    for o in 0..ORCHESTRATORS {
        let rng = StdRng::seed_from_u64(rng.random());
        let plan = failover.clone();
        tasks.push(tokio::spawn(orchestrate(
            fleet.clone(),
            shared.clone(),
            o,
            rng,
            deadline,
            shape.pre_lock_lease,
            plan,
        )));
    }
    for u in 0..USERS {
        let rng = StdRng::seed_from_u64(rng.random());
        tasks.push(tokio::spawn(use_items(fleet.clone(), shared.clone(), u, rng, deadline, real_time)));
    }
    if operator {
        // A stream of its own, so the other actors' draws are those of the seed without it.
        let rng = StdRng::seed_from_u64(seed ^ 0x0f0f_f04c_e5e1_ea5e);
        tasks.push(tokio::spawn(operate(fleet.clone(), shared.clone(), rng, deadline)));
    }
    for task in tasks {
        task.await.expect("an actor panicked");
    }
    let failover = match failover {
        Some(plan) => plan.record().await,
        None => None,
    };
    // Quiet: no more faults, every late write landed, every lease and cache ran out.
    fleet.store.clear_rules();
    fleet.store.settle().await;
    tokio::time::sleep(shape.settle).await;
    let (finals, final_exchanges) = read_back(&fleet).await;

    let history: Vec<oracle::Committed> = fleet
        .recording
        .versions()
        .into_iter()
        .map(|(sent, from, version)| oracle::Committed { from, sent, version })
        .collect();
    let mut log = std::mem::take(&mut *log(&shared));
    // A force-released holder was told it holds until its lease's end; it holds until
    // the approval (which its later calls are refused by).
    for h in log.holdings.iter_mut() {
        let fingerprint = lockprobe::document::LockToken::from_presented(h.token.as_str()).digest();
        if let Some((_, at)) = log.force_released.iter().filter(|(f, _)| *f == fingerprint).min_by_key(|(_, at)| *at) {
            h.until = h.until.min(*at);
        }
    }
    let mut violations = oracle::judge(&Evidence {
        history: &history,
        ops: &log.ops,
        holdings: &log.holdings,
        known_tokens: &log.known,
        finals: &finals,
        decision_age: DECISION_AGE,
    });
    violations.extend(log.replays.violations.iter().cloned());
    let contract_violations = contract_oracle::judge(
        &log.exchanges,
        &final_exchanges,
        &contract_oracle::Declared { decision_age: DECISION_AGE },
    )
    .into_iter()
    .map(|v| Violation { kind: v.kind, detail: v.detail })
    .collect();
    let timelines = oracle::timelines(&history);
    let mut by_phase = BTreeMap::new();
    for injection in fleet.store.injections() {
        let phase = injection.id.as_deref().and_then(|id| oracle::phase_at(&timelines, id, injection.at));
        *by_phase.entry((phase_name(phase), injection.fault)).or_default() += 1;
    }
    SeedReport {
        violations,
        contract_violations,
        exchanges: log.exchanges.len(),
        user_ops: log.ops.len(),
        lock_calls: log.lock_calls,
        migrations_swapped: log.swapped,
        force_released: log.force_released.len(),
        replays: log.replays,
        faults: fleet.store.stats(),
        by_phase,
        skew_ms,
        failover,
    }
}

fn phase_name(phase: Option<Phase>) -> &'static str {
    phase.map_or("unlocked", Phase::as_str)
}

fn to_delta(d: Duration) -> TimeDelta {
    lockprobe::clock::to_chrono(d)
}

/// Every user key, read back through instance 0 once everything settled: as the first
/// oracle reads it, and as the second records it (the read's exchange).
async fn read_back(fleet: &Fleet) -> (HashMap<(String, String), Final>, contract_oracle::Finals) {
    let mut out = HashMap::new();
    let mut exchanges = contract_oracle::Finals::new();
    for resource in RESOURCES {
        for u in 0..USERS {
            for k in 0..KEYS_PER_USER {
                let key = format!("u{u}-k{k}");
                let sent = fleet.now();
                let a = fleet.read(0, resource, &key).await;
                let call = Call::Read { key: key.clone() };
                exchanges.insert(
                    (resource.to_owned(), key.clone()),
                    exchange("read-back".to_owned(), resource, call, (None, None), sent, fleet.now(), &a),
                );
                let seen = match (a.status, a.body["tombstone"].as_bool()) {
                    (200, Some(true)) => Final::Tombstone,
                    (200, _) => Final::Present(a.body["value"].clone()),
                    (404, _) => Final::Absent,
                    (other, _) => Final::Other(other),
                };
                out.insert((resource.to_owned(), key), seen);
            }
        }
    }
    (out, exchanges)
}

/// A user: reads, writes and deletes its own keys, on random resources and instances,
/// one operation at a time (so the order of its acknowledgements is the order of its
/// effects). `real_time`: the fleet's clock is real time, where a decision can precede
/// its answer by more than a scheduling instant.
async fn use_items(
    fleet: Arc<Fleet>,
    shared: Shared,
    u: usize,
    mut rng: StdRng,
    deadline: DateTime<Utc>,
    real_time: bool,
) {
    let mut n = 0u64;
    while fleet.now() < deadline {
        tokio::time::sleep(ms(rng.random_range(20..300))).await;
        let resource = RESOURCES[rng.random_range(0..RESOURCES.len())];
        let key = format!("u{u}-k{}", rng.random_range(0..KEYS_PER_USER));
        let instance = rng.random_range(0..fleet.instances());
        let (op, value) = match rng.random_range(0..10) {
            0..4 => (Op::Read, None),
            4..8 => {
                n += 1;
                (Op::Write, Some(json!({"u": u, "n": n})))
            }
            _ => (Op::Delete, None),
        };
        let sent = fleet.now();
        let answer = match op {
            Op::Read => in_step("read", fleet.read(instance, resource, &key)).await,
            Op::Write => in_step("write", fleet.write(instance, resource, &key, value.clone().unwrap())).await,
            Op::Delete => in_step("delete", fleet.delete(instance, resource, &key)).await,
        };
        let at = fleet.now();
        let call = match op {
            Op::Read => Call::Read { key: key.clone() },
            Op::Write => Call::Write { key: key.clone(), value: value.clone().unwrap_or_default() },
            Op::Delete => Call::Delete { key: key.clone() },
        };
        log(&shared).exchanges.push(exchange(format!("u{u}"), resource, call, (None, None), sent, at, &answer));
        log(&shared).ops.push(UserOp {
            at,
            decided_from: if real_time { sent } else { at },
            instance,
            resource: resource.into(),
            key,
            op,
            status: answer.status,
            value,
        });
    }
}

/// An orchestrator's view of one lock call's answer.
enum Outcome {
    /// 2xx.
    Done(Answer),
    /// A definite refusal (4xx, or 503 that applied nothing).
    Refused(Answer),
    /// Still unknown after the repeats.
    Unknown,
}

/// An orchestrator: migrates random resources, one at a time, start to finish, or gives
/// up (and releases) when refused, now and then "crashing" without releasing.
struct Orchestrator {
    fleet: Arc<Fleet>,
    shared: Shared,
    me: usize,
    rng: StdRng,
    /// Unanswered pre-locks to recover at the end: (resource, key, lease, target).
    unanswered: Vec<(String, String, f64, Option<String>)>,
    /// Pre-locks granted, to repeat under their key later.
    granted: Vec<Granted>,
    /// The pre-locks' lease, seconds.
    lease: f64,
    /// A failover to make when a call of its step is first sent.
    failover: Option<Arc<FailoverPlan>>,
}

async fn orchestrate(
    fleet: Arc<Fleet>,
    shared: Shared,
    me: usize,
    rng: StdRng,
    deadline: DateTime<Utc>,
    lease: f64,
    failover: Option<Arc<FailoverPlan>>,
) {
    let mut o = Orchestrator { fleet, shared, me, rng, unanswered: Vec::new(), granted: Vec::new(), lease, failover };
    while o.fleet.now() < deadline {
        o.migrate().await;
        let pause = ms(o.rng.random_range(0..1_500));
        tokio::time::sleep(pause).await;
    }
    o.recover().await;
    // Repeats come after the orchestrator's own run, so the run is the same seed for
    // seed with or without them (RELIABILITY.md's catches stay comparable), and each
    // repeat comes after every later call this orchestrator made.
    for g in std::mem::take(&mut o.granted) {
        o.replay(&g).await;
    }
}

/// A pre-lock that was granted: what to repeat, and what it got.
#[derive(Clone)]
struct Granted {
    resource: String,
    key: String,
    lease: f64,
    target: Option<String>,
    token: String,
}

impl Orchestrator {
    fn key(&mut self, what: &str) -> String {
        format!("o{}-{what}-{:016x}", self.me, self.rng.random::<u64>())
    }

    fn instance(&mut self) -> usize {
        self.rng.random_range(0..self.fleet.instances())
    }

    /// Sends a lock call under one key, repeating it while its outcome is unknown; every
    /// attempt is recorded for the second oracle as `what` on `resource` with `token`.
    async fn call<F, Fut>(
        &mut self,
        step: &'static str,
        (resource, token, key): (&str, Option<&str>, &str),
        what: Call,
        send: F,
    ) -> Outcome
    where
        F: Fn(Arc<Fleet>, usize) -> Fut,
        Fut: std::future::Future<Output = Answer>,
    {
        // Once an answer was unknown, only a decision settles it: a later "nothing was
        // applied" speaks for that attempt, not for the one that may still land.
        let mut unknown = false;
        let failover = self.failover.clone();
        if let Some(plan) = failover.as_ref().filter(|p| !p.after_ack) {
            plan.at(step);
        }
        for _ in 0..6 {
            let instance = self.instance();
            let sent = self.fleet.now();
            let answer = in_step(step, send(self.fleet.clone(), instance)).await;
            let record = exchange(
                format!("o{}", self.me),
                resource,
                what.clone(),
                (token, Some(key)),
                sent,
                self.fleet.now(),
                &answer,
            );
            {
                let mut shared = log(&self.shared);
                shared.lock_calls += 1;
                shared.exchanges.push(record);
            }
            match (answer.status, answer.problem()) {
                (200..=299, _) => {
                    if let Some(plan) = failover.as_ref().filter(|p| p.after_ack) {
                        plan.at(step);
                    }
                    return Outcome::Done(answer);
                }
                (503, Some("outcome-unknown")) => unknown = true,
                (503, _) if unknown => {}
                // Nothing was applied, or the decision was refused: a definite answer.
                _ => return Outcome::Refused(answer),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if unknown {
            Outcome::Unknown
        } else {
            Outcome::Refused(Answer { status: 503, body: serde_json::Value::Null, retry_after: None, route: None })
        }
    }

    /// Remembers a lock view's token and lease: a newer view of the same token tells
    /// the lease as it stands now (an escalation may shorten it), so it replaces the end.
    fn held(&self, resource: &str, answer: &Answer) {
        let (Some(token), Some(until)) = (answer.field("token"), answer.time("expiresAt")) else { return };
        let mut log = log(&self.shared);
        log.known.insert(token.to_owned());
        if let Some(h) = log.holdings.iter_mut().find(|h| h.token == token) {
            h.until = until;
            return;
        }
        log.holdings.push(Holding {
            resource: resource.to_owned(),
            token: token.to_owned(),
            from: self.fleet.now(),
            until,
            orchestrator: self.me,
        });
    }

    /// A resource the route view shows unlocked, if one turns up in a few looks (so
    /// orchestrators rarely race each other: a slow pre-lock mostly meets no rival).
    async fn pick(&mut self) -> String {
        let mut resource = RESOURCES[self.rng.random_range(0..RESOURCES.len())];
        for _ in 0..3 {
            let instance = self.instance();
            if self.fleet.route(instance, resource).await.body["lock"].is_null() {
                break;
            }
            resource = RESOURCES[self.rng.random_range(0..RESOURCES.len())];
        }
        resource.to_owned()
    }

    async fn migrate(&mut self) {
        let resource = self.pick().await;
        let lease = self.lease;
        let target = self.rng.random_bool(0.5).then(|| LOCATIONS[self.rng.random_range(0..2)].to_owned());
        let key = self.key("pre");
        let r = resource.clone();
        let (k, t) = (key.clone(), target.clone());
        let pre = self
            .call("preLock", (&resource.clone(), None, &key.clone()), Call::PreLock { duration: lease }, move |f, i| {
                let (r, k, t) = (r.clone(), k.clone(), t.clone());
                async move { f.pre_lock(i, &r, &k, lease, t.as_deref()).await }
            })
            .await;
        let pre = match pre {
            Outcome::Done(a) => a,
            Outcome::Unknown => {
                self.unanswered.push((resource, key, lease, target));
                return;
            }
            Outcome::Refused(_) => return,
        };
        self.held(&resource, &pre);
        let token = pre.field("token").unwrap().to_owned();
        self.granted.push(Granted {
            resource: resource.clone(),
            key: key.clone(),
            lease,
            target: target.clone(),
            token: token.clone(),
        });
        let replied = self.fleet.now();
        // Eager orchestrators escalate at the instant the service named; careful ones wait
        // from their own answer too, plus a buffer.
        let effective = pre.time("effectiveAt").unwrap();
        let start = if self.rng.random_bool(0.7) {
            effective
        } else {
            effective.max(replied + to_delta(TTL + BOUND)) + TimeDelta::milliseconds(200)
        };
        self.fleet.until(start).await;
        if !self.escalate(&resource, &token, "hardDelete", 5.0).await {
            return self.release(&resource, &token).await;
        }
        tokio::time::sleep(ms(self.rng.random_range(0..2_000))).await;
        if self.rng.random_bool(0.4) {
            // Renew close to the lease's end: a late renewal is the interesting one.
            if !self.renew_near_the_end(&resource, &token).await {
                return self.release(&resource, &token).await;
            }
        }
        let write_lease = self.rng.random_range(1.0..3.0);
        if !self.escalate(&resource, &token, "write", write_lease).await {
            return self.release(&resource, &token).await;
        }
        tokio::time::sleep(ms(self.rng.random_range(0..800))).await;
        if self.rng.random_bool(0.05) {
            return; // crashed: the lease ends it
        }
        if self.rng.random_bool(0.75) {
            self.swap(&resource, &token, target).await;
        } else {
            self.release(&resource, &token).await;
        }
    }

    async fn escalate(&mut self, resource: &str, token: &str, phase: &'static str, lease: f64) -> bool {
        let key = self.key(phase);
        for _ in 0..5 {
            let (r, k, t) = (resource.to_owned(), key.clone(), token.to_owned());
            let what = Call::Escalate { phase: phase.to_owned(), duration: lease };
            let outcome = self
                .call("escalate", (resource, Some(token), &key.clone()), what, move |f, i| {
                    let (r, k, t) = (r.clone(), k.clone(), t.clone());
                    async move { f.escalate(i, &r, &k, &t, phase, lease).await }
                })
                .await;
            match outcome {
                Outcome::Done(a) => {
                    self.held(resource, &a);
                    return true;
                }
                // Too early by the deciding instance's clock (skew): try again shortly.
                Outcome::Refused(a)
                    if a.problem() == Some("invalid-transition")
                        && a.body["detail"].as_str().is_some_and(|d| d.contains("before effectiveAt")) =>
                {
                    tokio::time::sleep(ms(300)).await;
                }
                _ => return false,
            }
        }
        false
    }

    async fn renew_near_the_end(&mut self, resource: &str, token: &str) -> bool {
        let view = self.fleet.route(0, resource).await;
        let Some(ends) = view.body["lock"]["expiresAt"].as_str().and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        else {
            return false;
        };
        let before = TimeDelta::milliseconds(self.rng.random_range(0..400));
        self.fleet.until(ends.to_utc() - before).await;
        let key = self.key("renew");
        let (r, t) = (resource.to_owned(), token.to_owned());
        let outcome = self
            .call("renew", (resource, Some(token), &key.clone()), Call::Renew, move |f, i| {
                let (r, k, t) = (r.clone(), key.clone(), t.clone());
                async move { f.renew(i, &r, &k, &t, 5.0).await }
            })
            .await;
        match outcome {
            Outcome::Done(a) => {
                self.held(resource, &a);
                true
            }
            _ => false,
        }
    }

    async fn swap(&mut self, resource: &str, token: &str, declared: Option<String>) {
        let view = self.fleet.route(0, resource).await;
        let here = view.field("location").unwrap_or(LOCATIONS[0]).to_owned();
        let to = declared.unwrap_or_else(|| if here == LOCATIONS[0] { LOCATIONS[1] } else { LOCATIONS[0] }.to_owned());
        let key = self.key("swap");
        let (r, t) = (resource.to_owned(), token.to_owned());
        let outcome = self
            .call("swap", (resource, Some(token), &key.clone()), Call::Swap, move |f, i| {
                let (r, k, t, to) = (r.clone(), key.clone(), t.clone(), to.clone());
                async move { f.swap(i, &r, &k, &t, &to).await }
            })
            .await;
        match outcome {
            Outcome::Done(_) => log(&self.shared).swapped += 1,
            _ => self.release(resource, token).await,
        }
    }

    async fn release(&mut self, resource: &str, token: &str) {
        let key = self.key("release");
        let (r, t) = (resource.to_owned(), token.to_owned());
        let _ = self
            .call("release", (resource, Some(token), &key.clone()), Call::Release, move |f, i| {
                let (r, k, t) = (r.clone(), key.clone(), t.clone());
                async move { f.release(i, &r, &k, &t).await }
            })
            .await;
    }

    /// Repeats a granted pre-lock under its key, from a random instance, until it is
    /// decided (a few tries), and judges the answer: the first call's lock while it lives,
    /// 409 after its release or swap, 410 after its lapse; never a fresh lock.
    async fn replay(&mut self, g: &Granted) {
        let mut answer = None;
        for _ in 0..4 {
            let instance = self.instance();
            let sent = self.fleet.now();
            let a =
                in_step("preLock", self.fleet.pre_lock(instance, &g.resource, &g.key, g.lease, g.target.as_deref()))
                    .await;
            let what = Call::PreLock { duration: g.lease };
            let record =
                exchange(format!("o{}", self.me), &g.resource, what, (None, Some(&g.key)), sent, self.fleet.now(), &a);
            {
                let mut shared = log(&self.shared);
                shared.lock_calls += 1;
                shared.exchanges.push(record);
            }
            let undecided = a.status == 503 || a.status == 429;
            answer = Some(a);
            if !undecided {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let a = answer.expect("at least one try");
        let mut log = log(&self.shared);
        let granted = a.field("token").filter(|_| (200..=299).contains(&a.status)).map(str::to_owned);
        match (a.status, a.problem(), granted) {
            (200..=299, _, Some(t)) if t == g.token => log.replays.same_lock += 1,
            (409, Some("token-mismatch"), _) => log.replays.released += 1,
            (410, Some("lock-expired"), _) => log.replays.lapsed += 1,
            (410, Some("lock-force-released"), _) => log.replays.force_released += 1,
            (429 | 503, _, _) => log.replays.deferred += 1,
            (status, problem, fresh) => {
                // A fresh lock's token is known now (to the replaying orchestrator): the
                // violation is the grant, not an orphan besides it.
                if let Some(t) = &fresh {
                    log.known.insert(t.clone());
                }
                let what = match fresh {
                    Some(_) => "a fresh lock".to_owned(),
                    None => format!("{status} {}", problem.unwrap_or("(no problem type)")),
                };
                log.replays.violations.push(Violation {
                    kind: "replay",
                    detail: format!(
                        "orchestrator {} repeated its pre-lock of {} under key {} and got {what}",
                        self.me, g.resource, g.key
                    ),
                });
            }
        }
    }

    /// After the active period: every pre-lock whose answer never came is repeated under
    /// its key until its outcome is known; a granted one is released.
    async fn recover(&mut self) {
        for (resource, key, lease, target) in std::mem::take(&mut self.unanswered) {
            loop {
                let sent = self.fleet.now();
                let answer = self.fleet.pre_lock(0, &resource, &key, lease, target.as_deref()).await;
                let what = Call::PreLock { duration: lease };
                let record = exchange(
                    format!("o{}", self.me),
                    &resource,
                    what,
                    (None, Some(&key)),
                    sent,
                    self.fleet.now(),
                    &answer,
                );
                log(&self.shared).exchanges.push(record);
                match (answer.status, answer.problem()) {
                    (503, _) => tokio::time::sleep(Duration::from_secs(1)).await,
                    (201, _) => {
                        // A grant learned late is held like any other, until released.
                        self.held(&resource, &answer);
                        let token = answer.field("token").unwrap().to_owned();
                        self.release(&resource, &token).await;
                        break;
                    }
                    _ => break,
                }
            }
        }
    }
}

/// The operator: now and then, a live lock on a random resource is force-released by
/// two admin principals (contract 1.4), its holder none the wiser until refused. The
/// request and the approval are each repeated while their outcome is unknown, as the
/// admin command's user would; every approval is recorded for the second oracle, and
/// every one that may have taken effect (200, or still unknown) for the first.
async fn operate(fleet: Arc<Fleet>, shared: Shared, mut rng: StdRng, deadline: DateTime<Utc>) {
    while fleet.now() < deadline {
        tokio::time::sleep(ms(rng.random_range(1_000..4_000))).await;
        let resource = RESOURCES[rng.random_range(0..RESOURCES.len())];
        let view = in_step("forceRelease", fleet.admin_view(rng.random_range(0..fleet.instances()), resource, 0)).await;
        let lock = &view.body["lock"];
        if view.status != 200 || lock.is_null() || lock["live"] != json!(true) {
            continue;
        }
        let (Some(fingerprint), Some(phase)) = (lock["fingerprint"].as_str(), lock["phase"].as_str()) else { continue };
        let key = format!("op-{:016x}", rng.random::<u64>());
        let mut request = None;
        for _ in 0..6 {
            let i = rng.random_range(0..fleet.instances());
            let a = in_step("forceRelease", fleet.force_request(i, resource, 0, &key, fingerprint, phase)).await;
            match a.status {
                201 => {
                    request = a.body["request"]["id"].as_str().map(str::to_owned);
                    break;
                }
                503 => tokio::time::sleep(Duration::from_secs(1)).await,
                _ => break,
            }
        }
        let Some(request) = request else { continue };
        // The second person takes a moment: the holder may renew or escalate meanwhile.
        tokio::time::sleep(ms(rng.random_range(0..1_500))).await;
        let mut first_sent = None;
        for _ in 0..6 {
            let i = rng.random_range(0..fleet.instances());
            let sent = fleet.now();
            let a = in_step("forceRelease", fleet.force_approve(i, resource, 1, &request)).await;
            let record = exchange("operator".into(), resource, Call::ForceRelease, (None, None), sent, fleet.now(), &a);
            log(&shared).exchanges.push(record);
            let unknown = a.status == 503 && a.problem() == Some("outcome-unknown");
            if a.status == 200 || unknown {
                first_sent.get_or_insert(sent);
            }
            if a.status != 503 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if let Some(sent) = first_sent {
            log(&shared).force_released.push((fingerprint.to_owned(), sent));
        }
    }
}

/// Runs `seeds` on two threads, each seed in its own paused runtime.
fn campaign(
    seeds: std::ops::Range<u64>,
    legacy: &'static [Fault],
    stop_at_first_violation: bool,
    shape: Shape,
    operator: bool,
) -> Vec<(u64, SeedReport)> {
    let next = Arc::new(Mutex::new(seeds));
    // Each oracle's first catch: with `stop_at_first_violation`, seeds stop once both
    // oracles have caught something (each seed taken in order, so each oracle's first
    // catch is the same whatever the threads' timing).
    let found = Arc::new([std::sync::atomic::AtomicBool::new(false), std::sync::atomic::AtomicBool::new(false)]);
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (next, found) = (next.clone(), found.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                loop {
                    if stop_at_first_violation && found.iter().all(|f| f.load(std::sync::atomic::Ordering::Relaxed)) {
                        break;
                    }
                    let Some(seed) = next.lock().unwrap().next() else { break };
                    let rt =
                        tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
                    let report = rt.block_on(run_seed_with(seed, legacy, Backend::Memory, shape, None, operator));
                    if !report.violations.is_empty() {
                        found[0].store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    if !report.contract_violations.is_empty() {
                        found[1].store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    out.push((seed, report));
                }
                out
            })
        })
        .collect();
    let mut all: Vec<(u64, SeedReport)> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    all.sort_by_key(|(seed, _)| *seed);
    all
}

/// One test of this binary at a time. The real-time ones (on the local Cosmos server)
/// judge what gets through in seconds of wall time, and the seeded campaigns keep both
/// cores busy: run side by side on a 2-core machine, the real-time ones starved and
/// neither their traffic nor their violations were what they measure.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SLOT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SLOT.lock().unwrap_or_else(|e| e.into_inner())
}

/// `name` from the environment, or `default` when unset. A value that is not a number,
/// or a count of 0 that would empty the test it sizes (`minimum` 1), fails the test
/// rather than let it pass having judged nothing.
fn env_u64(name: &str, default: u64, minimum: u64) -> u64 {
    let Ok(text) = std::env::var(name) else { return default };
    let value: u64 = text.trim().parse().unwrap_or_else(|_| panic!("{name}={text:?} is not a whole number"));
    assert!(value >= minimum, "{name}={value} is below {minimum}: the test would judge nothing");
    value
}

/// Prints the campaign's figures (for RELIABILITY.md) and returns the violations.
fn summarize(reports: &[(u64, SeedReport)]) -> Vec<(u64, Violation)> {
    let mut faults = FaultStats::default();
    let mut by_phase: BTreeMap<(&'static str, FaultKind), u64> = BTreeMap::new();
    let (mut ops, mut calls, mut swaps) = (0, 0, 0);
    let mut replays = Replays::default();
    for (_, r) in reports {
        replays.add(&r.replays);
        faults.add(&r.faults);
        for (k, n) in &r.by_phase {
            *by_phase.entry(*k).or_default() += n;
        }
        ops += r.user_ops;
        calls += r.lock_calls;
        swaps += r.migrations_swapped;
    }
    let skews = reports.iter().map(|(_, r)| r.skew_ms.abs()).max().unwrap_or(0);
    let violations: Vec<(u64, Violation)> =
        reports.iter().flat_map(|(s, r)| r.violations.iter().map(move |v| (*s, v.clone()))).collect();
    println!("campaign: {} seeds, {ops} user operations, {calls} lock calls, {swaps} swaps, {} faults injected, one instance skewed by up to {skews} ms", reports.len(), faults.injected_total());
    println!("faults injected by the phase of the resource they hit:");
    let phases = ["unlocked", "preLock", "hardDelete", "write"];
    println!("  {:<12} {}", "fault", phases.map(|p| format!("{p:>11}")).join(""));
    for fault in CAMPAIGN_FAULTS {
        let row: Vec<String> =
            phases.iter().map(|p| format!("{:>11}", by_phase.get(&(*p, fault)).copied().unwrap_or(0))).collect();
        println!("  {:<12} {}", fault.as_str(), row.join(""));
    }
    println!("faults injected by the call they hit:");
    let steps = ["preLock", "escalate", "renew", "swap", "release", "read", "write", "delete"];
    println!("  {:<12} {}", "fault", steps.map(|p| format!("{p:>9}")).join(""));
    for fault in CAMPAIGN_FAULTS {
        let row: Vec<String> = steps.iter().map(|s| format!("{:>9}", faults.injected_in_step(s, fault))).collect();
        println!("  {:<12} {}", fault.as_str(), row.join(""));
    }
    println!(
        "pre-locks repeated under their key: {}: {} the same lock, {} released (409), {} lapsed (410), {} force-released (410), {} deferred (429/503), {} answered otherwise",
        replays.total(),
        replays.same_lock,
        replays.released,
        replays.lapsed,
        replays.force_released,
        replays.deferred,
        replays.violations.len()
    );
    println!("violations: {}", violations.len());
    for (seed, v) in violations.iter().take(10) {
        println!("  seed {seed}: {} - {}", v.kind, v.detail);
    }
    let second = second_oracle(reports);
    let exchanges: usize = reports.iter().map(|(_, r)| r.exchanges).sum();
    println!(
        "second oracle (the exchanges alone, by the contract): {exchanges} exchanges, {} violations",
        second.len()
    );
    for (seed, v) in second.iter().take(10) {
        println!("  seed {seed}: {} - {}", v.kind, v.detail);
    }
    violations
}

/// What the second oracle found, seed by seed.
fn second_oracle(reports: &[(u64, SeedReport)]) -> Vec<(u64, Violation)> {
    reports.iter().flat_map(|(s, r)| r.contract_violations.iter().map(move |v| (*s, v.clone()))).collect()
}

/// A seed's rules inject every kind the campaign says it covers, and no other.
#[test]
fn a_seeds_rules_inject_exactly_the_campaign_kinds() {
    let rules = fault_rules(&mut StdRng::seed_from_u64(1));
    let mut kinds: Vec<FaultKind> = rules.iter().map(|r| r.action.kind()).collect();
    kinds.sort();
    kinds.dedup();
    let mut expected = CAMPAIGN_FAULTS.to_vec();
    expected.sort();
    assert_eq!(kinds, expected);
}

/// Inside the scheme's assumptions: 0 violations over 1,000 seeds (by default), and
/// every fault kind hits every phase of the lifecycle.
#[test]
fn a_thousand_seeds_of_store_faults_break_nothing() {
    let _slot = one_at_a_time();
    let first = env_u64("LOCKPROBE_CAMPAIGN_FIRST_SEED", 0, 0);
    let n = env_u64("LOCKPROBE_CAMPAIGN_SEEDS", 1_000, 1);
    let started = std::time::Instant::now();
    let reports = campaign(first..first + n, &[], false, MEMORY, false);
    let violations = summarize(&reports);
    println!("took {:.1?}", started.elapsed());
    assert!(violations.is_empty(), "{} violations; first: {:?}", violations.len(), violations.first());
    let second = second_oracle(&reports);
    assert!(second.is_empty(), "the second oracle found {}; first: {:?}", second.len(), second.first());
    let by_phase: BTreeMap<(&str, FaultKind), u64> =
        reports.iter().flat_map(|(_, r)| r.by_phase.clone()).fold(BTreeMap::new(), |mut m, (k, n)| {
            *m.entry(k).or_default() += n;
            m
        });
    if n >= 1_000 {
        for phase in ["unlocked", "preLock", "hardDelete", "write"] {
            for fault in CAMPAIGN_FAULTS {
                assert!(
                    by_phase.get(&(phase, fault)).copied().unwrap_or(0) > 0,
                    "no {} fault in the {phase} phase",
                    fault.as_str()
                );
            }
        }
    }
    let swaps: usize = reports.iter().map(|(_, r)| r.migrations_swapped).sum();
    assert!(swaps as u64 >= n, "migrations must get through: {swaps} swaps in {n} seeds");
    let replays = reports.iter().fold(Replays::default(), |mut all, (_, r)| {
        all.add(&r.replays);
        all
    });
    // Each answer a repeat may rightly get must have come up, or the check judged less
    // than it says.
    if n >= 1_000 {
        assert!(
            replays.same_lock > 0 && replays.released > 0 && replays.lapsed > 0,
            "repeats must meet live, released and lapsed locks: {replays:?}"
        );
    }
}

/// The campaign with an operator force-releasing live locks at random moments while
/// their holders go on, under the same store faults (contract 1.4): both oracles find
/// nothing, force-releases get through, and some of them meet a store fault.
#[test]
fn force_releases_under_store_faults_break_nothing() {
    let _slot = one_at_a_time();
    let n = env_u64("LOCKPROBE_FORCE_RELEASE_SEEDS", 200, 1);
    let started = std::time::Instant::now();
    let reports = campaign(0..n, &[], false, MEMORY, true);
    let violations = summarize(&reports);
    println!("took {:.1?}", started.elapsed());
    assert!(violations.is_empty(), "{} violations; first: {:?}", violations.len(), violations.first());
    let second = second_oracle(&reports);
    assert!(second.is_empty(), "the second oracle found {}; first: {:?}", second.len(), second.first());
    let released: usize = reports.iter().map(|(_, r)| r.force_released).sum();
    let faulted: u64 = reports
        .iter()
        .map(|(_, r)| CAMPAIGN_FAULTS.iter().map(|f| r.faults.injected_in_step("forceRelease", *f)).sum::<u64>())
        .sum();
    let by_kind: Vec<String> = CAMPAIGN_FAULTS
        .iter()
        .map(|f| {
            let n: u64 = reports.iter().map(|(_, r)| r.faults.injected_in_step("forceRelease", *f)).sum();
            format!("{} {n}", f.as_str())
        })
        .collect();
    println!("store faults in force-release calls: {}", by_kind.join(", "));
    let refused_holders: usize = reports.iter().map(|(_, r)| r.replays.force_released).sum();
    println!("force-releases: {released} approved in {n} seeds; {faulted} store faults in their steps; {refused_holders} repeated pre-locks told lock-force-released");
    if n >= 200 {
        assert!(released as u64 >= n / 4, "force-releases must get through: {released} in {n} seeds");
        assert!(faulted > 0, "no store fault met a force-release call");
    }
}

/// Seeds six times as long, where every resource sees more lock calls than contract
/// 1.1 kept records of (the legacy eviction is caught at the first of them, below):
/// every repeat still gets its own answer, and nothing else breaks either.
#[test]
fn repeats_after_many_lock_calls_get_their_own_answer() {
    let _slot = one_at_a_time();
    let n = env_u64("LOCKPROBE_CAMPAIGN_LONG_SEEDS", 40, 1);
    let reports = campaign(0..n, &[], false, MEMORY_LONG, false);
    let violations = summarize(&reports);
    assert!(violations.is_empty(), "{} violations; first: {:?}", violations.len(), violations.first());
    let second = second_oracle(&reports);
    assert!(second.is_empty(), "the second oracle found {}; first: {:?}", second.len(), second.first());
    let replays = reports.iter().fold(Replays::default(), |mut all, (_, r)| {
        all.add(&r.replays);
        all
    });
    assert!(
        replays.same_lock > 0 && replays.released > 0 && replays.lapsed > 0,
        "repeats must meet live, released and lapsed locks: {replays:?}"
    );
}

/// Runs seeds with `legacy` switched on until the oracle finds a violation; it must,
/// within 1,000 seeds, and it must be one the fixed protocol exists to prevent. The
/// campaign is deterministic (paused time, seeded faults, seeds taken in order), so the
/// first seed that catches it and the kind it is caught as are the figures RELIABILITY.md
/// records ("Legacy behaviours are caught"): a change to either is a change to that
/// table, made with it.
///
/// The second oracle judges the same seeds, and seeds go on until both have caught it:
/// `second` is its first catch (seed and kind) as RELIABILITY.md records it.
fn caught(legacy: &'static [Fault], recorded_seed: u64, kind: &str, second: (u64, &str)) {
    caught_in(legacy, MEMORY, recorded_seed, kind, second);
}

/// [`caught`], seeds of the given shape.
fn caught_in(legacy: &'static [Fault], shape: Shape, recorded_seed: u64, kind: &str, second: (u64, &str)) {
    let reports = campaign(0..1_000, legacy, true, shape, false);
    let violations = summarize(&reports);
    let (seed, first) = violations.first().unwrap_or_else(|| panic!("the campaign must catch {legacy:?}"));
    println!("{legacy:?} caught at seed {seed}: {} - {}", first.kind, first.detail);
    assert!(
        violations
            .iter()
            .all(|(_, v)| v.kind == kind || matches!(v.kind, "enforcement" | "lost-write" | "resurrected")),
        "a legacy behaviour breaks enforcement, data or its own promise, nothing else: {violations:?}"
    );
    assert_eq!(
        (*seed, first.kind),
        (recorded_seed, kind),
        "{legacy:?}: RELIABILITY.md records seed {recorded_seed}, kind {kind}"
    );
    let found = second_oracle(&reports);
    let second_first = found.first().map(|(seed, v)| (*seed, v.kind));
    println!("{legacy:?}: the second oracle's first catch: {second_first:?}");
    assert_eq!(
        second_first,
        Some(second),
        "{legacy:?}: RELIABILITY.md records the second oracle's first catch as {second:?}"
    );
}

/// The legacy `effectiveAt` (from decide time) is found within 1,000 seeds.
#[test]
fn the_legacy_effective_at_is_caught_within_a_thousand_seeds() {
    let _slot = one_at_a_time();
    caught(&[Fault::LegacyEffectiveAt], 201, "enforcement", (201, "delete-under-hard-delete"));
}

/// The legacy renewal (no lapse rule) is found within 1,000 seeds.
#[test]
fn the_legacy_renewal_is_caught_within_a_thousand_seeds() {
    let _slot = one_at_a_time();
    // The second oracle does not catch seed 121 (not examined; before the swap's fence
    // moved the seeds, its miss of seed 45 was deletes let through after the holder's
    // swap was sent, when the exchanges alone cannot tell whether the lock had ended).
    // At seed 179 a write was accepted under the write lock the late renewal resurrected.
    caught(&[Fault::LegacyRenewal], 121, "enforcement", (179, "write-under-write-lock"));
}

/// Contract 1.1's record eviction (16 records, the oldest dropped) is found within
/// 1,000 seeds of 90 s: a repeated pre-lock whose record was evicted by later calls gets
/// a fresh lock, or 423, instead of its own answer. (In the suite's 15 s seeds a
/// resource sees fewer than 16 lock calls; inside contract 1.3's budget of 256 a repeat
/// is never evicted at all.)
#[test]
fn the_legacy_record_eviction_is_caught_within_a_thousand_seeds() {
    let _slot = one_at_a_time();
    caught_in(&[Fault::LegacyRecordEviction], MEMORY_LONG, 0, "replay", (0, "fresh-lock-for-a-key"));
}

/// A smaller set on the local Cosmos DB server, in real time (its commit times are the
/// server's `_ts`): four seeds at once, each on a database of its own. The oracle takes a
/// version that imposes a lock to be in force from the instant its write was answered
/// (never before its commit: it can miss a violation in that gap, never invent one), and
/// one that lifts a lock from the instant its write was sent.
///
/// A round of four seeds swaps 1 to 3 migrations through the faults (12 s of traffic
/// each), and now and then none; the swap path must have been exercised for the run to
/// say anything about it, so a round without a swap is followed by another (at most
/// three), every round's violations judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The slot is held for the whole test on purpose; no other task of its runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn store_faults_on_the_cosmos_server_break_nothing() {
    let _slot = one_at_a_time();
    let n = env_u64("LOCKPROBE_COSMOS_CAMPAIGN_SEEDS", 4, 1);
    let server = cosmos_server::CosmosServer::start();
    let (mut injected, mut swaps) = (0u64, 0usize);
    for round in 0..3u64 {
        let seeds = (round * n..(round + 1) * n).map(|seed| {
            let endpoint = server.endpoint();
            async move {
                let database = cosmos_server::unique_database(&format!("campaign-{seed}"));
                let store = cosmos_server::connect_with(&endpoint, &prometheus::Registry::new(), |a| {
                    a.database = Some(database)
                })
                .await;
                (seed, run_seed(seed, &[], Backend::Given(Arc::new(store)), COSMOS).await)
            }
        });
        let reports = futures::future::join_all(seeds).await;
        let violations = summarize(&reports);
        assert!(violations.is_empty(), "{} violations; first: {:?}", violations.len(), violations.first());
        let second = second_oracle(&reports);
        assert!(second.is_empty(), "the second oracle found {}; first: {:?}", second.len(), second.first());
        injected += reports.iter().map(|(_, r)| r.faults.injected_total()).sum::<u64>();
        swaps += reports.iter().map(|(_, r)| r.migrations_swapped).sum::<usize>();
        if swaps > 0 {
            break;
        }
        println!("round {round}: no migration swapped; another round");
    }
    assert!(injected > 0 && swaps > 0, "faults were injected ({injected}) and migrations got through ({swaps})");
}

/// The replication lag of the failover campaign's accounts: within the declared bound.
const FAILOVER_LAG: Duration = Duration::from_millis(200);

/// A store on `database` of the two-region account, as one instance would have it.
async fn two_region_store(
    regions: &cosmos_server::CosmosRegions,
    database: &str,
    legacy_static_write_region: bool,
) -> Arc<dyn LocationStore> {
    let args = cosmos_server::two_region_args(regions, database);
    let mut config = cosmos_server::config_from(&args);
    config.legacy_static_write_region = legacy_static_write_region;
    let store = lockprobe::store::cosmos::CosmosStore::connect(config, &prometheus::Registry::new())
        .await
        .expect("connects to the two-region account");
    Arc::new(store)
}

/// A planned failover (replication lag within the bound) in the middle of each
/// lifecycle step, on a two-region account of its own, with users reading, writing and
/// deleting on both instances, each instance on its own store: 0 violations, and each
/// failover made and followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The slot is held for the whole test on purpose; no other task of its runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn a_planned_failover_in_each_lifecycle_step_breaks_nothing() {
    let _slot = one_at_a_time();
    let steps = ["preLock", "escalate", "renew", "swap", "release"];
    let runs = steps.iter().enumerate().map(|(i, step)| async move {
        let regions = Arc::new(cosmos_server::CosmosServer::start_two_regions(FAILOVER_LAG));
        let database = cosmos_server::unique_database(&format!("failover-{step}"));
        let stores = vec![
            two_region_store(&regions, &database, false).await,
            two_region_store(&regions, &database, false).await,
        ];
        let plan = Arc::new(FailoverPlan::new(regions.clone(), step, cosmos_server::Failover::Planned));
        let backend = Backend::Given(Arc::new(PerInstance(stores)));
        let report = run_seed_with(200 + i as u64, &[], backend, COSMOS, Some(plan), false).await;
        let status = regions.status().await;
        (*step, report, status)
    });
    let results = futures::future::join_all(runs).await;
    println!("failover campaign (planned, lag {FAILOVER_LAG:?}, bound {BOUND:?}):");
    println!(
        "  {:<10} {:>9} {:>8} {:>8} {:>7} {:>6} {:>10}",
        "step", "failovers", "took ms", "user ops", "calls", "swaps", "violations"
    );
    let mut violations = Vec::new();
    for (step, report, status) in &results {
        let took = report.failover.as_ref().map_or(0, |f| f.took_ms);
        println!(
            "  {:<10} {:>9} {:>8} {:>8} {:>7} {:>6} {:>10}",
            step,
            status.failovers.len(),
            took,
            report.user_ops,
            report.lock_calls,
            report.migrations_swapped,
            report.violations.len()
        );
        for v in report.violations.iter().chain(&report.contract_violations) {
            println!("    {step}: {} - {}", v.kind, v.detail);
            violations.push((*step, v.clone()));
        }
    }
    for (step, report, status) in &results {
        let record = report.failover.as_ref().unwrap_or_else(|| panic!("no {step} call came: no failover made"));
        assert_eq!((record.mode.as_str(), record.lost_writes), ("planned", 0), "{step}");
        assert_eq!(status.write_region, cosmos_server::READ_REGION, "{step}");
        assert!(report.user_ops > 0 && report.lock_calls > 0, "{step}: traffic ran");
    }
    assert!(violations.is_empty(), "{} violations; first: {:?}", violations.len(), violations.first());
}

/// After a failover the old write region is a replica; here it then lags 4 s, far beyond
/// the declared bound. Stores that follow the write region never read it for a lock
/// decision: 0 violations. Stores with the write region a static setting (the behaviour
/// before issue 18) keep deciding on it, and the oracle catches what that lets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The slot is held for the whole test on purpose; no other task of its runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn after_a_failover_only_a_store_that_follows_the_write_region_stays_safe_when_the_old_one_lags() {
    let _slot = one_at_a_time();
    // Whether the static instance happens to decide on the lagging region during the
    // lag is a matter of timing: up to three attempts for it to show; the following
    // fleet must stay safe in every one.
    for attempt in 1..=LAG_ATTEMPTS {
        if lagging_old_region_run(attempt).await {
            return;
        }
    }
    panic!("the oracles must catch decisions made on the lagging old region (none in {LAG_ATTEMPTS} attempts)");
}

/// Attempts of [`after_a_failover_only_a_store_that_follows_the_write_region_stays_safe_when_the_old_one_lags`].
const LAG_ATTEMPTS: u32 = 3;

/// One run of the lag test; returns whether the static fleet's violations showed.
async fn lagging_old_region_run(attempt: u32) -> bool {
    let runs = [false, true].into_iter().map(|legacy| async move {
        let regions = Arc::new(cosmos_server::CosmosServer::start_two_regions(FAILOVER_LAG));
        let database = cosmos_server::unique_database(&format!("failover-lag-{legacy}"));
        // With `legacy`, instance 1 keeps the static write region while instance 0
        // follows the account, as a fleet with one instance not yet upgraded would.
        let stores = vec![
            two_region_store(&regions, &database, false).await,
            two_region_store(&regions, &database, legacy).await,
        ];
        let plan = FailoverPlan::new(regions.clone(), "preLock", cosmos_server::Failover::Planned)
            .then_lag(Duration::from_secs(4));
        let backend = Backend::Given(Arc::new(PerInstance(stores)));
        (legacy, run_seed_with(300, &[], backend, COSMOS, Some(Arc::new(plan)), false).await)
    });
    let results = futures::future::join_all(runs).await;
    for (legacy, report) in &results {
        let kinds: BTreeMap<&str, usize> = report.violations.iter().fold(BTreeMap::new(), |mut m, v| {
            *m.entry(v.kind).or_default() += 1;
            m
        });
        println!(
            "{}: {} user ops, {} lock calls, {} swaps, violations {kinds:?}",
            if *legacy { "static write region" } else { "discovered write region" },
            report.user_ops,
            report.lock_calls,
            report.migrations_swapped
        );
        for v in report.violations.iter().take(5) {
            println!("  {} - {}", v.kind, v.detail);
        }
        for v in report.contract_violations.iter().take(5) {
            println!("  second oracle: {} - {}", v.kind, v.detail);
        }
        assert!(report.failover.is_some(), "the failover was made");
    }
    let (_, following) = &results[0];
    let (_, legacy) = &results[1];
    assert!(following.violations.is_empty(), "attempt {attempt}: {:?}", following.violations.first());
    assert!(
        following.contract_violations.is_empty(),
        "attempt {attempt}, second oracle: {:?}",
        following.contract_violations.first()
    );
    // Either oracle catching it counts: both judge every run, from different evidence.
    let caught = !legacy.violations.is_empty() || !legacy.contract_violations.is_empty();
    if !caught {
        println!("attempt {attempt}: the static instance made no decision on the lagging region this time");
    }
    caught
}

/// A forced failover (outside the assumptions: it loses the commits the new write
/// region had not received) right after an escalation was acknowledged, replication
/// 1.5 s behind (so the escalation is lost, with whatever else the lag held): the test
/// asserts that commits were lost and that each is named.
/// Violations may follow; each must be one the oracle names, and the run's figures go to
/// RELIABILITY.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The slot is held for the whole test on purpose; no other task of its runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn a_forced_failover_loses_commits_and_every_violation_is_named() {
    let _slot = one_at_a_time();
    // A lag of 1.5 s: the failover must come while the acknowledged escalation is still
    // replicating, also on a loaded machine where the control request takes a while.
    let regions = Arc::new(cosmos_server::CosmosServer::start_two_regions(Duration::from_millis(1500)));
    let database = cosmos_server::unique_database("failover-forced");
    let stores =
        vec![two_region_store(&regions, &database, false).await, two_region_store(&regions, &database, false).await];
    let plan = FailoverPlan::new(regions.clone(), "escalate", cosmos_server::Failover::Forced).after_ack();
    let backend = Backend::Given(Arc::new(PerInstance(stores)));
    let report = run_seed_with(400, &[], backend, COSMOS, Some(Arc::new(plan)), false).await;
    let record = report.failover.as_ref().expect("an escalation came: the failover was made");
    let status = regions.status().await;
    let lost: Vec<String> = status.lost_writes.iter().map(|w| format!("{} {}", w.op, w.id)).collect();
    let kinds: BTreeMap<&str, usize> = report.violations.iter().fold(BTreeMap::new(), |mut m, v| {
        *m.entry(v.kind).or_default() += 1;
        m
    });
    println!(
        "forced failover after an escalation: {} writes lost {lost:?}; {} user ops, {} lock calls, {} swaps; violations {kinds:?}",
        record.lost_writes, report.user_ops, report.lock_calls, report.migrations_swapped
    );
    for v in report.violations.iter().take(5) {
        println!("  {} - {}", v.kind, v.detail);
    }
    for v in report.contract_violations.iter().take(5) {
        println!("  second oracle: {} - {}", v.kind, v.detail);
    }
    assert_eq!(record.mode, "forced");
    assert_eq!(status.write_region, cosmos_server::READ_REGION);
    // The premise: the escalation acknowledged just before was still replicating, so the
    // forced failover lost it (and whatever else was committed in the lag), and every
    // loss is named.
    assert!(record.lost_writes >= 1, "the forced failover lost no commit: {record:?}");
    assert_eq!(lost.len(), record.lost_writes, "every lost write is named by the server: {lost:?}");
    // A lost commit can be a pre-lock's record: the pre-lock repeated under its key at
    // the end then gets a fresh lock, named `replay`.
    for v in &report.violations {
        assert!(
            ["enforcement", "lost-write", "resurrected", "two-holders", "orphan", "replay"].contains(&v.kind),
            "an unnamed violation: {v:?}"
        );
    }
    for v in &report.contract_violations {
        assert!(
            [
                "two-holders",
                "fresh-lock-for-a-key",
                "write-under-write-lock",
                "delete-under-write-lock",
                "delete-under-hard-delete",
                "read-not-read-through",
                "not-linearizable"
            ]
            .contains(&v.kind),
            "an unnamed violation of the second oracle: {v:?}"
        );
    }
}

/// The oracle's enforcement rule, shown to bite and shown not to invent (issue 32): a
/// planted history of one resource under a write lock that a release lifts. The release's
/// write was sent at 30 s and answered at 34 s (a planned failover holds answers back);
/// the store may have committed it anywhere in between.
mod oracle_planted {
    use super::*;
    use lockprobe::routing::lifecycle::{self, LockPolicy, PreLockRequest};
    use lockprobe::routing::{LocationDocument, LockToken};
    use lockprobe::store::{ETag, Versioned};

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    /// The versions: pre-lock at 0, hardDelete at 10, write at 20 (lease to 80), and the
    /// release sent at 30, answered at 34; and the lock's token, which its orchestrator
    /// learned.
    fn history() -> (Vec<oracle::Committed>, String) {
        let policy = LockPolicy {
            skew_margin: Duration::ZERO,
            ..LockPolicy::new(Duration::from_secs(5), Duration::from_secs(3600))
        };
        let req = PreLockRequest { owner: "o".into(), duration: Duration::from_secs(600), target_location: None };
        // One token for every call: the tests name it in holdings and learned tokens.
        static TOKEN: std::sync::OnceLock<LockToken> = std::sync::OnceLock::new();
        let token = TOKEN.get_or_init(LockToken::generate).clone();
        let doc = LocationDocument::new("r0", "westeurope");
        let pre = lifecycle::pre_lock(&doc, &req, token.clone(), &policy, at(0)).unwrap();
        let hard =
            lifecycle::escalate(&pre, &token, Phase::HardDelete, Duration::from_secs(300), &policy, at(10)).unwrap();
        let write = lifecycle::escalate(&hard, &token, Phase::Write, Duration::from_secs(60), &policy, at(20)).unwrap();
        let released = lifecycle::release(&write, &token, at(30)).unwrap();
        let version = |doc: &LocationDocument, committed: DateTime<Utc>| Versioned {
            doc: doc.clone(),
            etag: ETag(format!("e{}", committed.timestamp())),
            committed_at: committed,
        };
        let versions = [(pre, 0, 0), (hard, 10, 10), (write, 20, 20), (released, 30, 34)]
            .into_iter()
            .map(|(doc, sent, answered)| oracle::Committed {
                from: at(answered),
                sent: at(sent),
                version: version(&doc, at(sent)),
            })
            .collect();
        (versions, token.expose().to_owned())
    }

    fn write_accepted(decided_from: i64, answered: i64) -> UserOp {
        UserOp {
            at: at(answered),
            decided_from: at(decided_from),
            instance: 0,
            resource: "r0".into(),
            key: "k".into(),
            op: Op::Write,
            status: 200,
            value: Some(json!(1)),
        }
    }

    fn kinds(ops: &[UserOp]) -> Vec<&'static str> {
        let (_, token) = history();
        judged(ops, &[], &HashSet::from([token]), &HashMap::new())
    }

    /// The oracle's kinds for the planted history with these ops, holdings, learned
    /// tokens (the history's own token is `history().1`) and final reads.
    fn judged(
        ops: &[UserOp],
        holdings: &[Holding],
        known: &HashSet<String>,
        finals: &HashMap<(String, String), Final>,
    ) -> Vec<&'static str> {
        let (history, _) = history();
        let evidence = Evidence {
            history: &history,
            ops,
            holdings,
            known_tokens: known,
            finals,
            decision_age: Duration::from_millis(500),
        };
        oracle::judge(&evidence).into_iter().map(|v| v.kind).collect()
    }

    fn holding(token: &str, from: i64, until: i64, orchestrator: usize) -> Holding {
        Holding { resource: "r0".into(), token: token.into(), from: at(from), until: at(until), orchestrator }
    }

    #[test]
    fn two_tokens_told_they_hold_the_resource_at_once_are_two_holders() {
        let (_, token) = history();
        let known = HashSet::from([token.clone(), "other".to_owned()]);
        let none = HashMap::new();
        // The history's lock is held from 0 until its release was sent (30); another
        // token told it holds from 25: both at once.
        let overlapping = [holding(&token, 0, 80, 0), holding("other", 25, 90, 1)];
        assert_eq!(judged(&[], &overlapping, &known, &none), ["two-holders"]);
        // From 31, after the release was sent: one after the other.
        let after = [holding(&token, 0, 80, 0), holding("other", 31, 90, 1)];
        assert!(judged(&[], &after, &known, &none).is_empty());
    }

    #[test]
    fn a_lock_whose_token_nobody_learned_is_an_orphan() {
        let (_, token) = history();
        let none = HashMap::new();
        assert_eq!(judged(&[], &[], &HashSet::new(), &none), ["orphan"]);
        assert!(judged(&[], &[], &HashSet::from([token]), &none).is_empty());
    }

    #[test]
    fn items_that_do_not_end_as_acknowledged_are_lost_or_resurrected() {
        let (_, token) = history();
        let known = HashSet::from([token]);
        let key = ("r0".to_owned(), "k".to_owned());
        // An acknowledged write (value 1), before any lock.
        let ops = [UserOp { decided_from: at(-10), ..write_accepted(-10, -10) }];
        let ended = |f: Final| HashMap::from([(key.clone(), f)]);
        assert_eq!(judged(&ops, &[], &known, &ended(Final::Absent)), ["lost-write"]);
        assert!(judged(&ops, &[], &known, &ended(Final::Present(json!(1)))).is_empty());
        // Then an acknowledged delete: a value read back is resurrected.
        let mut deleted = ops.to_vec();
        deleted.push(UserOp { op: Op::Delete, status: 204, value: None, ..write_accepted(-5, -5) });
        assert_eq!(judged(&deleted, &[], &known, &ended(Final::Present(json!(1)))), ["resurrected"]);
        assert!(judged(&deleted, &[], &known, &ended(Final::Absent)).is_empty());
    }

    #[test]
    fn a_write_accepted_while_the_write_lock_certainly_held_is_an_enforcement_violation() {
        assert_eq!(kinds(&[write_accepted(25, 26)]), ["enforcement"]);
    }

    #[test]
    fn a_write_accepted_after_the_release_was_sent_is_none_though_its_answer_came_later() {
        // The release may have been committed at 31: a write decided in [31, 32] may
        // have been decided after it. Before the send-time rule, the oracle took the
        // release to be in force only from its answer (34) and called this a violation.
        assert!(kinds(&[write_accepted(31, 32)]).is_empty());
        // A window that began before the release was sent, and ended after: still none.
        assert!(kinds(&[write_accepted(29, 31)]).is_empty());
        // After the answer: no lock at all.
        assert!(kinds(&[write_accepted(35, 35)]).is_empty());
    }

    #[test]
    fn the_decision_age_after_the_escalation_is_no_violation_either() {
        // Decided 0.3 s after the write escalation committed: an instance may have decided
        // on the version just before, within the service's decision age (0.5 s).
        let mut op = write_accepted(20, 21);
        op.decided_from = at(20) + TimeDelta::milliseconds(300);
        assert!(kinds(&[op]).is_empty());
    }
}
