//! Model checking of the lock protocol (see `docs/model.md`): every interleaving of a
//! small fleet, over the real lifecycle, freshness and enforcement code.
//!
//! The fixed protocol must have no counterexample at the suite's bounds; each broken
//! variant must have one at those same bounds, printed as a readable trace.
//! `cargo run --example model -- --help` runs larger bounds.

// Shared with examples/model.rs, which uses the parts the tests do not.
#[allow(dead_code)]
mod spec;

use spec::{check, render_path, replay_on_fixed, Bounds, LockModel, Variant};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(2)
}

#[test]
fn the_fixed_protocol_has_no_counterexample() {
    let model = LockModel::new(Variant::Fixed, Bounds::suite());
    // Stops at the first counterexample: if there is none, every state is explored.
    let (model, outcome) = check(model, threads(), true, false);
    println!(
        "fixed protocol at {:?}: {} states ({} distinct), depth {}, {:.1?}",
        model.bounds, outcome.states, outcome.unique, outcome.depth, outcome.elapsed
    );
    for (name, path) in &outcome.counterexamples {
        println!("COUNTEREXAMPLE: {name}\n{}", render_path(&model, path));
    }
    assert!(outcome.counterexamples.is_empty(), "the fixed protocol violates a property");
    for wanted in ["a swap completes", "a retry settles an ambiguous pre-lock"] {
        assert!(outcome.examples.contains(&wanted), "never reached: {wanted} (the model is vacuous)");
    }
}

fn broken(variant: Variant) {
    let model = LockModel::new(variant, Bounds::suite());
    // One thread: the same (shortest) counterexample every run, as in docs/model.md.
    let (model, outcome) = check(model, 1, true, false);
    println!(
        "{} at the suite bounds: {} states ({} distinct), {:.1?}",
        variant.as_str(),
        outcome.states,
        outcome.unique,
        outcome.elapsed
    );
    assert!(!outcome.counterexamples.is_empty(), "{} was not caught", variant.as_str());
    for (name, path) in &outcome.counterexamples {
        println!("counterexample to \"{name}\":\n{}", render_path(&model, path));
        match replay_on_fixed(&model.bounds, path) {
            Ok(None) => println!("  the fixed protocol does not reproduce it on the same schedule"),
            Ok(Some(p)) => println!("  the fixed protocol violates \"{p}\" on the same schedule too"),
            Err(step) => println!("  the fixed protocol cannot take step {step} of it"),
        }
    }
}

#[test]
fn effective_at_from_the_decide_time_is_caught() {
    broken(Variant::LegacyEffectiveAt);
}

#[test]
fn renewal_without_the_lapse_rule_is_caught() {
    broken(Variant::LegacyRenewal);
}

#[test]
fn swap_without_if_match_is_caught() {
    broken(Variant::SwapWithoutIfMatch);
}

#[test]
fn escalation_before_effective_at_is_caught() {
    broken(Variant::EarlyEscalation);
}

#[test]
fn a_cache_serving_started_locks_is_caught() {
    broken(Variant::CacheServesStartedLocks);
}
