//! Runs the lock-protocol model checker (tests/model/) at bounds of your choosing.
//!
//! ```sh
//! cargo run --release --example model -- --orchestrators 3 --horizon 8
//! cargo run --release --example model -- --variant legacy-renewal
//! cargo run --release --example model -- --bounds record-cap --variant legacy-record-eviction
//! ```
//!
//! Prints the states explored, the time taken, the `sometimes` properties reached and a
//! readable trace of every counterexample. Exits 1 when the fixed protocol has a
//! counterexample or a broken variant has none, 64 on bad usage.

#[path = "../tests/model/spec.rs"]
#[allow(dead_code)]
mod spec;

use spec::{check, render_path, replay_on_fixed, Bounds, LockModel, Variant};

const USAGE: &str = "usage: model [--variant fixed|legacy-effective-at|legacy-renewal|swap-without-if-match|early-escalation|cache-serves-started-locks|legacy-record-eviction|format-1-writes|force-release-without-if-match|all]
             [--bounds suite|record-cap|force-release|release|behind|attempts|all]
             [--orchestrators N] [--instances N] [--horizon TICKS] [--delayed N] [--ambiguous N]
             [--attempts N] [--renewals N] [--release] [--requests N] [--writes N] [--deletes N]
             [--keyed-records N] [--force-release] [--skews -1,0,1] [--threads N] [--first]
defaults: variant fixed, each variant at the bounds its test uses (record-cap for
legacy-record-eviction, force-release for force-release-without-if-match, suite for the
others) unless --bounds names them; the other flags
change those bounds; --first stops at the first counterexample";

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(msg) => {
            eprintln!("{msg}\n{USAGE}");
            std::process::exit(64);
        }
    }
}

/// The bounds a variant's test checks it at: the record cap is reached only at its own.
fn default_bounds(variant: Variant) -> Bounds {
    match variant {
        Variant::LegacyRecordEviction => Bounds::record_cap(),
        Variant::ForceReleaseWithoutIfMatch => Bounds::force_release(),
        _ => Bounds::suite(),
    }
}

fn run() -> Result<bool, String> {
    let mut base: Option<Bounds> = None;
    let mut variants = vec![Variant::Fixed];
    let mut first = false;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Flags that change the bounds, applied to each variant's base in order.
    let mut changes: Vec<(String, String)> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            return Ok(true);
        }
        if flag == "--release" || flag == "--force-release" {
            changes.push((flag, String::new()));
            continue;
        }
        if flag == "--first" {
            first = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--variant" if value == "all" => variants = Variant::ALL.to_vec(),
            "--variant" => {
                variants = vec![*Variant::ALL
                    .iter()
                    .find(|v| v.as_str() == value)
                    .ok_or_else(|| format!("--variant: unknown variant {value:?}"))?]
            }
            "--bounds" => {
                base = Some(match value.as_str() {
                    "suite" => Bounds::suite(),
                    "record-cap" => Bounds::record_cap(),
                    "force-release" => Bounds::force_release(),
                    // The wider bounds scripts/model-bounds.sh runs (docs/model.md).
                    other => Bounds::wider(other).map(|(bounds, _)| bounds).ok_or_else(|| {
                        format!("--bounds: unknown bounds {other:?} (suite, record-cap, {})", Bounds::WIDER.join(", "))
                    })?,
                })
            }
            "--threads" => {
                threads = value.parse::<u8>().map_err(|_| format!("--threads: {value:?} is not a small number"))?.max(1)
                    as usize
            }
            _ => changes.push((flag, value)),
        }
    }
    let mut runs = Vec::new();
    for variant in variants {
        let mut bounds = base.clone().unwrap_or_else(|| default_bounds(variant));
        for (flag, value) in &changes {
            change(&mut bounds, flag, value)?;
        }
        if bounds.orchestrators == 0 || bounds.instances == 0 || bounds.attempts == 0 {
            return Err("orchestrators, instances and attempts must be at least 1".into());
        }
        bounds.validate(variant)?;
        runs.push((variant, bounds));
    }
    if std::env::var_os("MODEL_CENSUS").is_some() {
        let (variant, bounds) = runs.swap_remove(0);
        census(&LockModel::new(variant, bounds), 200_000);
        return Ok(true);
    }
    let mut all_as_expected = true;
    for (variant, bounds) in runs {
        let model = LockModel::new(variant, bounds.clone());
        let (model, outcome) = check(model, threads, first || variant != Variant::Fixed, true);
        println!(
            "{}: {} states, {} distinct, depth {}, {:.1?} ({} threads)\n  bounds {:?}",
            variant.as_str(),
            outcome.states,
            outcome.unique,
            outcome.depth,
            outcome.elapsed,
            threads,
            bounds
        );
        println!("  reached: {}", if outcome.examples.is_empty() { "-".into() } else { outcome.examples.join("; ") });
        for (name, path) in &outcome.counterexamples {
            println!("  counterexample to \"{name}\":\n{}", render_path(&model, path));
            if variant != Variant::Fixed {
                match replay_on_fixed(&model.bounds, path) {
                    Ok(None) => println!("  the fixed protocol does not reproduce it on the same schedule"),
                    Ok(Some(p)) => println!("  the fixed protocol violates \"{p}\" on the same schedule too"),
                    Err(step) => println!("  the fixed protocol cannot take step {step} of it"),
                }
            }
        }
        let as_expected = (variant == Variant::Fixed) == outcome.counterexamples.is_empty();
        if !as_expected {
            println!(
                "  UNEXPECTED: {}",
                if variant == Variant::Fixed { "a counterexample" } else { "no counterexample" }
            );
        }
        all_as_expected &= as_expected;
    }
    Ok(all_as_expected)
}

/// Applies one bounds flag to `bounds`.
fn change(bounds: &mut Bounds, flag: &str, value: &str) -> Result<(), String> {
    let number = || value.parse::<u8>().map_err(|_| format!("{flag}: {value:?} is not a small number"));
    match flag {
        "--release" => bounds.release = true,
        "--force-release" => bounds.force_release = true,
        "--orchestrators" => bounds.orchestrators = number()?,
        "--instances" => bounds.instances = number()?,
        "--horizon" => bounds.horizon = number()?,
        "--delayed" => bounds.delayed = number()?,
        "--ambiguous" => bounds.ambiguous = number()?,
        "--attempts" => bounds.attempts = number()?,
        "--renewals" => bounds.renewals = number()?,
        "--requests" => bounds.requests = number()?,
        "--writes" => bounds.writes = number()?,
        "--deletes" => bounds.deletes = number()?,
        "--keyed-records" => {
            bounds.keyed_records = match value.parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => return Err(format!("--keyed-records: {value:?} is not a count of at least 1")),
            }
        }
        "--skews" => {
            bounds.skews = value
                .split(',')
                .map(|k| k.trim().parse::<i8>().map_err(|_| format!("--skews: {k:?} is not an offset")))
                .collect::<Result<_, _>>()?
        }
        other => return Err(format!("unknown flag {other}")),
    }
    Ok(())
}

/// Debug aid: breadth-first over the first `limit` states, printing how they spread.
#[allow(dead_code)]
pub fn census(model: &LockModel, limit: usize) {
    use spec::State;
    use stateright::Model;
    use std::collections::{HashMap, HashSet, VecDeque};
    use std::hash::{Hash, Hasher};
    let fp = |s: &State| {
        let mut h = std::hash::DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    let mut seen = HashSet::new();
    let mut queue: VecDeque<State> = model.init_states().into();
    let mut hist: HashMap<String, usize> = HashMap::new();
    while let Some(s) = queue.pop_front() {
        if seen.len() >= limit {
            break;
        }
        if !seen.insert(fp(&s)) {
            continue;
        }
        let orch = |o: &spec::Orch| {
            format!(
                "{}{}{}{}",
                o.held.as_ref().map_or("-".to_string(), |h| format!("{}", h.phase)),
                o.call.as_ref().map_or("".to_string(), |(st, c)| format!(
                    " {st:?}/{}",
                    match c {
                        spec::Client::Ready { .. } => "ready",
                        spec::Client::Waiting { .. } => "wait",
                        spec::Client::Acked { .. } => "acked",
                    }
                )),
                if o.retry.is_some() { " retry" } else { "" },
                if o.swap.is_some() { " swap" } else { "" }
            )
        };
        for key in [
            format!("now {}", s.now),
            format!("versions {}", s.versions.len()),
            format!("inflight {}", s.inflight.len()),
            format!("o0 {}", orch(&s.orchs[0])),
            format!("o1 {}", orch(&s.orchs[1])),
            format!(
                "caches {}",
                s.caches
                    .iter()
                    .map(|c| c.as_ref().map_or("-".into(), |e| format!("e{}", e.etag)))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            format!("req {} data {:?} ghost {:?}", s.requests, s.data, s.ghost),
            format!("faults d{} a{}", s.delayed_used, s.ambiguous_used),
        ] {
            *hist.entry(key).or_default() += 1;
        }
        for next in model.next_states(&s) {
            queue.push_back(next);
        }
    }
    let mut rows: Vec<_> = hist.into_iter().collect();
    rows.sort();
    for (k, n) in rows {
        println!("{n:>8} {k}");
    }
}
