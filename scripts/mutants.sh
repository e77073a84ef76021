#!/usr/bin/env bash
# Mutation testing of the routing core (RELIABILITY.md, "Mutation score of the routing
# core"): cargo-mutants changes one thing at a time in the routing library and the
# memory store, rebuilds, and runs the tests named below; a mutant no test notices is a
# gap in the suite (or an equivalent change, explained in RELIABILITY.md).
#
# Not part of the test command: each mutant rebuilds the crate and relinks the tests it
# runs (about 16 s on 2 cores with the library's tests alone), and there are about 350
# of them.
#
#   scripts/mutants.sh                          # every file below, library unit tests
#   scripts/mutants.sh src/routing/lifecycle.rs # one file
#   MUTANTS_TESTS="--lib --test=routing_bugs" scripts/mutants.sh src/routing/client.rs
#
# Results land in mutants.out/ (caught.txt, missed.txt, timeout.txt, unviable.txt);
# score = caught / (caught + missed), timeouts counted as caught (and said how many).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=27.1.0
if ! cargo mutants --version 2>/dev/null | grep -q "$VERSION"; then
  cargo install --locked "cargo-mutants@$VERSION"
fi

FILES=("$@")
if [ ${#FILES[@]} -eq 0 ]; then
  FILES=(src/routing/lifecycle.rs src/routing/enforce.rs src/routing/client.rs
         src/routing/freshness.rs src/routing/cache.rs src/store/memory.rs)
fi
# The library's unit tests (lifecycle_tests.rs among them) by default; integration
# tests by name when a file's behaviour is only reached through them.
read -r -a TESTS <<< "${MUTANTS_TESTS:---lib}"

args=()
for f in "${FILES[@]}"; do
  args+=(--file "$f")
done
# The tests go to every cargo call (`--cargo-arg`), not only to `cargo test` (after
# `--`): cargo-mutants' build step would otherwise build every test target (all the
# integration tests and the examples) for every mutant (about 90 s a mutant on 2 cores,
# against about 16 s for `--lib` alone).
for t in "${TESTS[@]}"; do
  args+=("--cargo-arg=$t")
done
cargo mutants --no-shuffle "${args[@]}"
