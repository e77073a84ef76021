//! The release gate's rollout profiles: two builds (a *baseline*, the version a fleet
//! runs, and a *candidate*), each instance its own process, over one store they share,
//! walked through one migration while versions are mixed, rolled forward or rolled
//! back, so every lock phase is decided by one version and enforced by the other.
//!
//! Only the HTTP contract is used, and only what every contract version promises: the
//! lock calls' answers, the user operations' status codes and the route view. Items are
//! each process's own in the reference service, so what an item holds is not judged
//! across processes; every user operation is judged on the answer it got for the lock
//! phase certainly in force over its window: sent after the phase's lock call was
//! answered, the declared convergence delay and the buffer had passed, and before the
//! next lock call was sent; or, for an escalation, at once after its answer, since a
//! started lock is never served from a cache. Every failure names the instance's role
//! and the versions it declared. A migration that stops early has its lock released.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::gate::{listening_urls, CANDIDATE_KEY_ENV};
use crate::probe::checks::credentials::TargetTls;
use crate::probe::checks::target::{CallKey, Reply, TargetClient};
use crate::probe::outputs::gate_junit::JunitCase;

/// How the two versions are arranged while the migration runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RolloutProfile {
    /// One instance of each version for the whole migration; lock calls alternate
    /// between them.
    Mixed,
    /// Every instance starts on the baseline and is replaced by the candidate, one at a
    /// time, between the migration's phases.
    Rolling,
    /// Every instance starts on the candidate and is put back on the baseline, one at a
    /// time, between the migration's phases.
    Rollback,
}

impl RolloutProfile {
    /// Every rollout profile, in run order.
    pub const ALL: [RolloutProfile; 3] = [RolloutProfile::Mixed, RolloutProfile::Rolling, RolloutProfile::Rollback];

    /// The profile's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            RolloutProfile::Mixed => "mixed",
            RolloutProfile::Rolling => "rolling",
            RolloutProfile::Rollback => "rollback",
        }
    }

    /// The role each instance starts in.
    fn start(self) -> [Role; 2] {
        match self {
            RolloutProfile::Mixed => [Role::Baseline, Role::Candidate],
            RolloutProfile::Rolling => [Role::Baseline, Role::Baseline],
            RolloutProfile::Rollback => [Role::Candidate, Role::Candidate],
        }
    }

    /// The instance replaced after step `step`, and by which role: the instance the next
    /// step's lock call goes through ([`lock_instance`]), so from the first replacement
    /// on each phase is decided by the version just rolled in and enforced by the other.
    fn replaces_after(self, step: usize) -> Option<(usize, Role)> {
        let to = match self {
            RolloutProfile::Mixed => return None,
            RolloutProfile::Rolling => Role::Candidate,
            RolloutProfile::Rollback => Role::Baseline,
        };
        (step < 2).then(|| (lock_instance(step + 1), to))
    }
}

/// The instance step `step`'s lock call goes through: each in turn.
fn lock_instance(step: usize) -> usize {
    step % 2
}

/// Which build an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The version the fleet runs before the rollout.
    Baseline,
    /// The version being rolled out.
    Candidate,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Baseline => "baseline",
            Role::Candidate => "candidate",
        }
    }
}

/// What the rollout profiles run.
#[derive(Debug, Clone)]
pub struct RolloutOptions {
    /// The baseline binary (`BASELINE service ...`).
    pub baseline: PathBuf,
    /// The candidate binary.
    pub candidate: PathBuf,
    /// Flags for every process of both versions: the shared store's (`--store cosmos`
    /// and its `--cosmos-*` flags).
    pub service_args: Vec<String>,
    /// Flags for the baseline's processes only.
    pub baseline_args: Vec<String>,
    /// Flags for the candidate's processes only (e.g. `--write-format 1`).
    pub candidate_args: Vec<String>,
    /// Cache TTL of every instance.
    pub cache_ttl: Duration,
    /// Replication bound every instance declares.
    pub replication_bound: Duration,
    /// Wait on top of the declared convergence delay before a phase is judged.
    pub buffer: Duration,
    /// TLS to instances started with the service's `--tls-*` flags.
    pub tls: TargetTls,
}

/// One judged answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutCheck {
    /// The migration's step (`preLock`, `hardDelete`, `write`, `swap`).
    pub step: &'static str,
    /// What was sent (`pre-lock`, `write`, `delete`, `route`, ...).
    pub op: &'static str,
    /// Which instance answered.
    pub instance: usize,
    /// Its role and the versions it declared, e.g. `baseline, no contract version (1.1 or
    /// earlier)`.
    pub declared: String,
    /// What the contract demands.
    pub expected: String,
    /// What came back.
    pub observed: String,
    /// Whether the answer was what the contract demands.
    pub passed: bool,
}

impl RolloutCheck {
    /// `PASS|FAIL [step] op @ instance: expected .., observed ..`.
    pub fn line(&self) -> String {
        let verdict = if self.passed { "PASS" } else { "FAIL" };
        format!(
            "{verdict} [{}] {} @ instance {} ({}): expected {}, observed {}",
            self.step, self.op, self.instance, self.declared, self.expected, self.observed
        )
    }
}

/// What one rollout profile gave.
#[derive(Debug, Default)]
pub struct RolloutOutcome {
    /// Every judged answer, in order.
    pub checks: Vec<RolloutCheck>,
    /// Why the migration could not go on, if it could not.
    pub error: Option<String>,
    /// What the reader should know that is neither a pass nor a failure (a lock call
    /// repeated because its outcome was unknown).
    pub notes: Vec<String>,
}

impl RolloutOutcome {
    /// Whether the profile passed: every answer as demanded, and the migration finished.
    pub fn passed(&self) -> bool {
        self.error.is_none() && self.checks.iter().all(|c| c.passed)
    }

    /// The JUnit test cases of this profile (named by step, instance and operation, the
    /// same on every run), and its error as one more.
    pub fn junit_cases(&self, profile: RolloutProfile) -> Vec<JunitCase> {
        let class = |what: &str| format!("lockprobe.gate.rollout.{}.{what}", profile.name());
        // A repeat under one name is numbered ` #2`, ` #3`, ..., as the gate's other cases.
        let mut seen: std::collections::HashMap<(String, String), usize> = std::collections::HashMap::new();
        let mut cases: Vec<JunitCase> = self
            .checks
            .iter()
            .map(|c| {
                let class = class(&format!("{}.instance{}", c.step, c.instance));
                let mut name = format!("{} expects {}", c.op, c.expected);
                let n = seen.entry((class.clone(), name.clone())).or_default();
                *n += 1;
                if *n > 1 {
                    name = format!("{name} #{n}");
                }
                JunitCase { class, name, failure: (!c.passed).then(|| c.line()), error: None }
            })
            .collect();
        cases.push(JunitCase {
            class: class("migration"),
            name: "migration completed".to_owned(),
            failure: None,
            error: self.error.clone(),
        });
        cases
    }
}

/// The test prefix of every process and of the resource a profile migrates.
const TEST_PREFIX: &str = "rollout-";

/// How long each lock the profile takes lasts: far beyond the walk, so no lease ends in it.
const LEASE: Duration = Duration::from_secs(300);

/// One process per instance, each with the role it runs.
struct Fleet {
    options: RolloutOptions,
    key: String,
    processes: Vec<(Role, Child, String)>,
}

impl Fleet {
    async fn start(options: &RolloutOptions, roles: [Role; 2], key: &str) -> Result<Self, String> {
        let mut fleet = Self { options: options.clone(), key: key.to_owned(), processes: Vec::new() };
        for role in roles {
            let (child, url) = fleet.spawn(role).await?;
            fleet.processes.push((role, child, url));
        }
        Ok(fleet)
    }

    async fn spawn(&self, role: Role) -> Result<(Child, String), String> {
        let (binary, own) = match role {
            Role::Baseline => (&self.options.baseline, &self.options.baseline_args),
            Role::Candidate => (&self.options.candidate, &self.options.candidate_args),
        };
        let ttl = humantime::format_duration(self.options.cache_ttl).to_string();
        let bound = humantime::format_duration(self.options.replication_bound).to_string();
        let mut command = Command::new(binary);
        command
            .arg("service")
            .args(["--listen", "127.0.0.1:0", "--test-prefix", TEST_PREFIX, "--cache-ttl", &ttl])
            .args(["--instances", "1", "--replication-bound", &bound])
            .args(&self.options.service_args)
            .args(own)
            .env(CANDIDATE_KEY_ENV, &self.key)
            // Each refusal is judged from its answer; the processes' own logs would only
            // repeat them (a failure to start still reaches stderr).
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child =
            command.spawn().map_err(|e| format!("cannot start the {} ({}): {e}", role.name(), binary.display()))?;
        match listening_urls(&mut child, 1).await {
            Ok(mut urls) => Ok((child, urls.remove(0))),
            Err(e) => {
                let _ = child.kill().await;
                Err(format!("the {} ({}): {e}", role.name(), binary.display()))
            }
        }
    }

    /// Stops instance `index` and starts `role` in its place (on a new port).
    async fn replace(&mut self, index: usize, role: Role) -> Result<(), String> {
        let (child, url) = self.spawn(role).await?;
        let (_, mut old, _) = std::mem::replace(&mut self.processes[index], (role, child, url));
        let _ = old.kill().await;
        Ok(())
    }

    fn client(&self) -> Result<TargetClient, String> {
        let urls: Vec<String> = self.processes.iter().map(|(_, _, url)| url.clone()).collect();
        TargetClient::with_tls(&urls, &self.key, TEST_PREFIX, Duration::from_secs(10), &self.options.tls)
            .map_err(|e| e.to_string())
    }

    async fn stop(mut self) {
        for (_, child, _) in &mut self.processes {
            let _ = child.kill().await;
        }
    }
}

/// A judge of answers, naming the instance that gave each.
struct Judge<'a> {
    client: &'a TargetClient,
    roles: Vec<Role>,
    checks: &'a mut Vec<RolloutCheck>,
}

impl Judge<'_> {
    fn declared(&self, i: usize) -> String {
        format!("{}, {}", self.roles[i].name(), self.client.declared_by(i))
    }

    /// Records whether `reply` is one of `expected` (status codes, or a status with its
    /// problem type, e.g. `423 lock-held`).
    fn check(&mut self, step: &'static str, op: &'static str, i: usize, expected: &[&str], reply: &Reply) -> bool {
        let observed = describe(reply);
        // An expected bare status takes any problem type with it (`404` takes
        // `404 not-found`); one with a problem type takes only that type.
        let passed = expected.iter().any(|e| *e == observed || (!e.contains(' ') && reply.status.to_string() == *e));
        let declared = self.declared(i);
        self.checks.push(RolloutCheck {
            step,
            op,
            instance: i,
            declared,
            expected: expected.join(" or "),
            observed: observed.clone(),
            passed,
        });
        passed
    }
}

/// `423 lock-held`, `200`, `500 unsupported-document`.
fn describe(reply: &Reply) -> String {
    match &reply.problem {
        Some(p) => format!("{} {p}", reply.status),
        None => reply.status.to_string(),
    }
}

/// Runs `profile`: starts the fleet, walks one migration through it, stops it.
pub async fn run_profile(
    options: &RolloutOptions,
    profile: RolloutProfile,
    shutdown: CancellationToken,
) -> RolloutOutcome {
    let key = hex::encode(rand::random::<[u8; 16]>());
    let mut outcome = RolloutOutcome::default();
    let mut fleet = match Fleet::start(options, profile.start(), &key).await {
        Ok(f) => f,
        Err(e) => {
            outcome.error = Some(e);
            return outcome;
        }
    };
    let mut held = None;
    let walked = tokio::select! {
        r = walk(&mut fleet, profile, options, &mut outcome.checks, &mut outcome.notes, &mut held) => r,
        _ = shutdown.cancelled() => Err("interrupted".to_owned()),
    };
    outcome.error = walked.err();
    if let Some((resource, token)) = held {
        outcome.notes.push(release_left_behind(&fleet, &resource, &token).await);
    }
    fleet.stop().await;
    outcome
}

/// Releases the lock of a migration that stopped before its swap, through whichever
/// instance can (the shared store outlives the profile), and says how it went.
async fn release_left_behind(fleet: &Fleet, resource: &str, token: &str) -> String {
    let client = match fleet.client() {
        Ok(c) => c,
        Err(e) => return format!("the stopped migration's lock was not released: {e}"),
    };
    let mut answers = Vec::new();
    for i in 0..fleet.processes.len() {
        let key = CallKey::fresh();
        match client.until_known(&key, |k| client.release(i, resource, token, k)).await {
            // Released, or no longer this token's to release.
            Ok(r) if matches!(r.status, 204 | 409 | 410) => {
                return format!("released the stopped migration's lock through instance {i} ({})", describe(&r))
            }
            Ok(r) => answers.push(format!("instance {i}: {}", describe(&r))),
            Err(e) => answers.push(format!("instance {i}: {e}")),
        }
    }
    format!(
        "the stopped migration's lock on {resource} was not released ({}); it ends with its lease",
        answers.join("; ")
    )
}

/// The user operations' answers each phase demands, once in force on every instance.
struct Demands {
    write: &'static [&'static str],
    delete: &'static [&'static str],
}

const UNRESTRICTED: Demands = Demands { write: &["200", "201"], delete: &["204"] };
const HARD_DELETE: Demands = Demands { write: &["200", "201"], delete: &["202"] };
const WRITE_LOCKED: Demands = Demands { write: &["423 lock-held"], delete: &["423 lock-held"] };

/// One migration, each lock call through the next instance in turn, each phase judged
/// on every instance once it is certainly in force; between phases the profile
/// replaces instances.
async fn walk(
    fleet: &mut Fleet,
    profile: RolloutProfile,
    options: &RolloutOptions,
    checks: &mut Vec<RolloutCheck>,
    notes: &mut Vec<String>,
    held: &mut Option<(String, String)>,
) -> Result<(), String> {
    let resource = format!("{TEST_PREFIX}{}-{}", profile.name(), hex::encode(rand::random::<[u8; 4]>()));
    let target = "rollout-target";
    let mut token = String::new();
    let mut declared = Duration::ZERO;
    let steps: [(&'static str, &Demands); 4] =
        [("preLock", &UNRESTRICTED), ("hardDelete", &HARD_DELETE), ("write", &WRITE_LOCKED), ("swap", &UNRESTRICTED)];
    // The resource exists (at its home location) before the migration starts.
    {
        let client = fleet.client()?;
        let reply = client.write(0, &resource, "created", &json!(0)).await.map_err(|e| e.to_string())?;
        let roles = fleet.processes.iter().map(|p| p.0).collect();
        let mut judge = Judge { client: &client, roles, checks };
        if !judge.check("unlocked", "write", 0, UNRESTRICTED.write, &reply) {
            return Err("the resource could not be created".to_owned());
        }
    }
    for (step, (name, demands)) in steps.into_iter().enumerate() {
        let client = fleet.client()?;
        let roles: Vec<Role> = fleet.processes.iter().map(|p| p.0).collect();
        let mut judge = Judge { client: &client, roles, checks };
        let at = lock_instance(step);
        if name == "hardDelete" {
            // An item on every instance (its own process's) for the delete sent the moment
            // the escalation is answered; the pre-lock is in force.
            for i in 0..fleet.processes.len() {
                let r =
                    client.write(i, &resource, &format!("eager-{i}"), &json!(i)).await.map_err(|e| e.to_string())?;
                judge.check("preLock", "write", i, UNRESTRICTED.write, &r);
            }
        }
        // Repeated under its key while its outcome is unknown (a store write that timed
        // out may have landed): what counts is the call's decided outcome.
        let key = CallKey::fresh();
        let sends = std::sync::atomic::AtomicUsize::new(0);
        let counted = |k| {
            sends.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            k
        };
        let call = match name {
            "preLock" => {
                let send = |k| client.pre_lock(at, &resource, "lockprobe-rollout", LEASE, Some(target), counted(k));
                let r = client.until_known(&key, send).await.map_err(|e| e.to_string())?;
                if judge.check(name, "pre-lock", at, &["201"], &r) {
                    token = r.str_field("token").unwrap_or_default().to_owned();
                    let seconds = r.body.get("convergenceDelaySeconds").and_then(|s| s.as_f64()).unwrap_or(0.0);
                    declared = Duration::try_from_secs_f64(seconds).unwrap_or_default();
                }
                r
            }
            "swap" => {
                let send = |k| client.swap(at, &resource, &token, target, counted(k));
                client.until_known(&key, send).await.map_err(|e| e.to_string())?
            }
            phase => {
                let send = |k| client.escalate(at, &resource, &token, phase, LEASE, counted(k));
                client.until_known(&key, send).await.map_err(|e| e.to_string())?
            }
        };
        let sends = sends.into_inner();
        if sends > 1 {
            notes.push(format!(
                "the {} call through instance {at} ({}) was sent {sends} times under one key: its outcome was unknown",
                lock_op(name),
                judge.declared(at)
            ));
        }
        if name != "preLock" && !judge.check(name, lock_op(name), at, &["200"], &call) {
            return Err(format!("the {name} call was refused; the migration cannot go on"));
        }
        if token.is_empty() {
            return Err("the pre-lock was refused; the migration cannot go on".to_owned());
        }
        match name {
            "preLock" => *held = Some((resource.clone(), token.clone())),
            // The swap cleared the lock (its guard on the old location lapses by itself).
            "swap" => *held = None,
            _ => {}
        }
        if name == "preLock" {
            replay_elsewhere(&mut judge, notes, at, &resource, target, &key, &token).await?;
        }
        // A lock that has started is never served from a cache (contract, "The routing
        // path"): an escalation restricts every instance from its answer on.
        for i in 0..fleet.processes.len() {
            at_once(&mut judge, name, i, &resource).await?;
        }
        // In force everywhere from here: the declared delay, the skew margin (at most
        // the buffer) and the buffer after the answer; a pre-lock from its effectiveAt.
        let wait = declared + options.buffer + options.buffer;
        let effective_in = call
            .str_field("effectiveAt")
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .and_then(|t| (t.with_timezone(&chrono::Utc) - chrono::Utc::now()).to_std().ok())
            .unwrap_or_default();
        tokio::time::sleep(wait.max(effective_in + options.buffer)).await;
        for i in 0..fleet.processes.len() {
            judge_phase(&mut judge, name, i, &resource, target, demands).await?;
        }
        if let Some((index, role)) = profile.replaces_after(step) {
            fleet.replace(index, role).await?;
        }
    }
    Ok(())
}

/// The pre-lock repeated under its key through the other instance, as an
/// orchestrator's retry through a load balancer may land: from contract 1.1 keys are
/// kept in the document, so any instance answers 201 with the first call's token. Judged
/// only when both instances declare 1.1 or later; an instance that declares nothing may
/// be 1.0, which ignores the key (a note says it was not checked).
async fn replay_elsewhere(
    judge: &mut Judge<'_>,
    notes: &mut Vec<String>,
    at: usize,
    resource: &str,
    target: &str,
    key: &CallKey,
    token: &str,
) -> Result<(), String> {
    let other = 1 - at;
    let client = judge.client;
    // Versions are read from answers: the other instance has not answered yet.
    client.route(other, resource).await.map_err(|e| e.to_string())?;
    let undeclared: Vec<String> = [at, other]
        .into_iter()
        .filter(|i| client.declared_by(*i).at_least(1, 1) != Some(true))
        .map(|i| format!("instance {i} ({})", judge.declared(i)))
        .collect();
    if !undeclared.is_empty() {
        notes.push(format!(
            "not checked: the pre-lock repeated under its key through instance {other}, since {} may not honour keys",
            undeclared.join(" and ")
        ));
        return Ok(());
    }
    let send = |k| client.pre_lock(other, resource, "lockprobe-rollout", LEASE, Some(target), k);
    let r = client.until_known(key, send).await.map_err(|e| e.to_string())?;
    if judge.check("preLock", "pre-lock repeated under its key", other, &["201"], &r) {
        let same = r.str_field("token") == Some(token);
        let declared = judge.declared(other);
        judge.checks.push(RolloutCheck {
            step: "preLock",
            op: "repeated pre-lock's token",
            instance: other,
            declared,
            expected: "the first call's token".to_owned(),
            observed: if same { "the first call's token" } else { "another token" }.to_owned(),
            passed: same,
        });
    }
    Ok(())
}

/// Judges instance `i` the moment step `step`'s escalation was answered: a hard-delete
/// lock tombstones a delete, a write lock blocks writes and deletes.
async fn at_once(judge: &mut Judge<'_>, step: &str, i: usize, resource: &str) -> Result<(), String> {
    let client = judge.client;
    let key = format!("eager-{i}");
    match step {
        "hardDelete" => {
            let r = client.delete(i, resource, &key).await.map_err(|e| e.to_string())?;
            judge.check("hardDelete-at-once", "delete", i, HARD_DELETE.delete, &r);
        }
        "write" => {
            let r = client.write(i, resource, &key, &json!("late")).await.map_err(|e| e.to_string())?;
            judge.check("write-at-once", "write", i, WRITE_LOCKED.write, &r);
            let r = client.delete(i, resource, &key).await.map_err(|e| e.to_string())?;
            judge.check("write-at-once", "delete", i, WRITE_LOCKED.delete, &r);
        }
        _ => {}
    }
    Ok(())
}

/// The lock call each step sends.
fn lock_op(step: &str) -> &'static str {
    match step {
        "preLock" => "pre-lock",
        "swap" => "swap",
        _ => "escalate",
    }
}

/// Judges instance `i` in step `step`: the route view shows the phase (or, after the
/// swap, the new location and no lock), and a write, a delete and a read get the
/// answers the phase demands. Each instance writes its own keys (items are its own).
async fn judge_phase(
    judge: &mut Judge<'_>,
    step: &'static str,
    i: usize,
    resource: &str,
    target: &str,
    demands: &Demands,
) -> Result<(), String> {
    let client = judge.client;
    let route = client.route(i, resource).await.map_err(|e| e.to_string())?;
    if judge.check(step, "route", i, &["200"], &route) {
        let (expected, observed) = if step == "swap" {
            (format!("location {target}, no lock"), route_summary(&route))
        } else {
            (format!("phase {step}"), route_summary(&route))
        };
        let passed = if step == "swap" {
            route.str_field("location") == Some(target) && route.body.get("lock").is_some_and(|l| l.is_null())
        } else {
            route.body.get("lock").and_then(|l| l.get("phase")).and_then(|p| p.as_str()) == Some(step)
        };
        let declared = judge.declared(i);
        judge.checks.push(RolloutCheck { step, op: "route view", instance: i, declared, expected, observed, passed });
    }
    let key = format!("{step}-{i}");
    let write = client.write(i, resource, &key, &json!(i)).await.map_err(|e| e.to_string())?;
    judge.check(step, "write", i, demands.write, &write);
    let delete = client.delete(i, resource, &key).await.map_err(|e| e.to_string())?;
    // Nothing written under a write lock: the delete is judged on the lock alone.
    judge.check(step, "delete", i, demands.delete, &delete);
    let read = client.read(i, resource, &key).await.map_err(|e| e.to_string())?;
    judge.check(step, "read", i, &["200", "404"], &read);
    if step == "write" {
        let through = read.timing.as_ref().is_some_and(|t| t.source == "read-through");
        let declared = judge.declared(i);
        judge.checks.push(RolloutCheck {
            step,
            op: "read route",
            instance: i,
            declared,
            expected: "read-through".to_owned(),
            observed: read.timing.as_ref().map_or("no Server-Timing".to_owned(), |t| t.source.clone()),
            passed: through,
        });
    }
    Ok(())
}

/// `location westeurope, lock preLock` from a route view.
fn route_summary(route: &Reply) -> String {
    let location = route.str_field("location").unwrap_or("?");
    match route.body.get("lock").and_then(|l| l.get("phase")).and_then(|p| p.as_str()) {
        Some(phase) => format!("location {location}, lock {phase}"),
        None => format!("location {location}, no lock"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_and_rollback_replace_each_instance_once_and_mixed_none() {
        for profile in RolloutProfile::ALL {
            let mut roles = profile.start();
            for step in 0..4 {
                if let Some((i, role)) = profile.replaces_after(step) {
                    roles[i] = role;
                }
            }
            let expected = match profile {
                RolloutProfile::Mixed => [Role::Baseline, Role::Candidate],
                RolloutProfile::Rolling => [Role::Candidate, Role::Candidate],
                RolloutProfile::Rollback => [Role::Baseline, Role::Baseline],
            };
            assert_eq!(roles, expected, "{}", profile.name());
        }
        assert_eq!(RolloutProfile::Rolling.start(), [Role::Baseline; 2]);
        assert_eq!(RolloutProfile::Rollback.start(), [Role::Candidate; 2]);
    }

    #[test]
    fn an_answer_passes_only_as_the_status_and_problem_demanded() {
        let reply = |status, problem: Option<&str>| Reply {
            status,
            body: serde_json::Value::Null,
            problem: problem.map(str::to_owned),
            retry_after: None,
            timing: None,
            store_region: None,
            elapsed: Duration::ZERO,
        };
        let client =
            TargetClient::new(&["http://127.0.0.1:1".into()], "k", TEST_PREFIX, Duration::from_secs(1)).unwrap();
        let mut checks = Vec::new();
        let mut judge = Judge { client: &client, roles: vec![Role::Baseline], checks: &mut checks };
        assert!(judge.check("write", "write", 0, WRITE_LOCKED.write, &reply(423, Some("lock-held"))));
        assert!(!judge.check("write", "write", 0, WRITE_LOCKED.write, &reply(500, Some("unsupported-document"))));
        assert!(!judge.check("preLock", "write", 0, UNRESTRICTED.write, &reply(500, Some("unsupported-document"))));
        assert!(judge.check("preLock", "write", 0, UNRESTRICTED.write, &reply(201, None)));
        assert!(!judge.check("hardDelete", "delete", 0, HARD_DELETE.delete, &reply(204, None)));
        assert!(judge.check("preLock", "read", 0, &["200", "404"], &reply(404, Some("not-found"))));
        assert!(!judge.check("write", "write", 0, WRITE_LOCKED.write, &reply(423, Some("other"))));
        let failed = checks.iter().find(|c| !c.passed).unwrap().line();
        assert!(failed.starts_with("FAIL [write] write @ instance 0 (baseline, no contract version"), "{failed}");
        let outcome = RolloutOutcome {
            checks: checks.clone(),
            error: Some("the write call was refused".into()),
            notes: Vec::new(),
        };
        let cases = outcome.junit_cases(RolloutProfile::Mixed);
        assert_eq!(cases.len(), checks.len() + 1);
        assert_eq!(cases[0].class, "lockprobe.gate.rollout.mixed.write.instance0");
        assert_eq!(cases[0].name, "write expects 423 lock-held");
        assert_eq!(cases[1].name, "write expects 423 lock-held #2");
        assert_eq!(cases[1].failure.as_deref(), Some(checks[1].line().as_str()));
        assert_eq!(cases.last().unwrap().error.as_deref(), Some("the write call was refused"));
        assert!(failed.ends_with("expected 423 lock-held, observed 500 unsupported-document"), "{failed}");
    }
}
