#!/usr/bin/env bash
# The whole test command, run again and again, quiet and under load (RELIABILITY.md,
# "The test command under load"): a suite that fails at random is a red build nobody
# trusts.
#
#   scripts/suite-stability.sh [PLAN]        # default NNNNNSSS
#
# PLAN is one letter a run, in order: N runs the test command (`CI=true bash .ci/run`)
# with nothing else started, S beside `stress-ng --cpu $LOCKPROBE_STRESS_CPU` (default
# 2). Each run works on a fresh clone of this checkout's HEAD under
# target/suite-stability/<start time>/clone (one build, kept between runs, as CI's would
# be), keeps its output as run-<n>.log and a line in runs.tsv: plan letter, commit, start
# (UTC), exit code, seconds, the one-minute load average at the start, its mean and
# maximum sampled every 30 s. Stops at the first failed run (the remaining runs would
# not be consecutive) and exits with its code; exit 0 when every run passed. A run takes
# about 20 minutes on a 2-core machine.
#
# LOCKPROBE_STABILITY_SEED=<checkout> copies that checkout's target/ into the fresh clone
# first, so that run 1 is a warm run like the others instead of a cold build (about 15
# minutes here); cargo still rebuilds whatever the commits differ in. (.test-tools/ is
# not copied: its Python environments hold their own absolute paths.)
set -euo pipefail
cd "$(dirname "$0")/.."

PLAN="${1:-NNNNNSSS}"
CPU="${LOCKPROBE_STRESS_CPU:-2}"
case "$PLAN" in '' | *[!NS]*) echo "suite-stability: PLAN must be letters N and S, got '$PLAN'" >&2; exit 64 ;; esac
case "$CPU" in '' | *[!0-9]* | 0) echo "suite-stability: LOCKPROBE_STRESS_CPU must be a positive number, got '$CPU'" >&2; exit 64 ;; esac
if [[ "$PLAN" == *S* ]] && ! command -v stress-ng >/dev/null; then
    echo "suite-stability: installing stress-ng (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q stress-ng >/dev/null
fi

OUT="$PWD/target/suite-stability/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
git clone --quiet --no-hardlinks "$PWD" "$OUT/clone"
COMMIT="$(git -C "$OUT/clone" rev-parse --short HEAD)"
if [ -n "${LOCKPROBE_STABILITY_SEED:-}" ]; then
    if [ ! -d "$LOCKPROBE_STABILITY_SEED/target" ]; then
        echo "suite-stability: LOCKPROBE_STABILITY_SEED has no target/: $LOCKPROBE_STABILITY_SEED" >&2
        exit 64
    fi
    echo "suite-stability: seeding target/ from $LOCKPROBE_STABILITY_SEED"
    mkdir -p "$OUT/clone/target"
    # Not the seed's own suite-stability/ runs: with this checkout as the seed, that
    # holds the clone being seeded.
    for entry in "$LOCKPROBE_STABILITY_SEED/target"/* "$LOCKPROBE_STABILITY_SEED/target"/.[!.]*; do
        [ -e "$entry" ] || continue
        [ "$(basename "$entry")" = suite-stability ] && continue
        cp -a "$entry" "$OUT/clone/target/"
    done
fi
printf 'run\tplan\tcommit\tstart\texit\tseconds\tload_at_start\tload_mean\tload_max\n' >"$OUT/runs.tsv"

STRESS=""
SAMPLER=""
cleanup() {
    [ -n "$STRESS" ] && kill "$STRESS" 2>/dev/null || true
    [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
}
trap cleanup EXIT

for n in $(seq 1 "${#PLAN}"); do
    kind="${PLAN:n-1:1}"
    if [ "$kind" = S ]; then
        stress-ng --cpu "$CPU" --timeout 24h >/dev/null 2>&1 &
        STRESS=$!
        sleep 20 # the one-minute average climbs with the load
    fi
    loads="$OUT/run-$n.load"
    (while true; do cut -d' ' -f1 /proc/loadavg >>"$loads"; sleep 30; done) &
    SAMPLER=$!
    start="$(date -u +%H:%M:%S)"
    at_start="$(cut -d' ' -f1 /proc/loadavg)"
    began=$(date +%s)
    code=0
    (cd "$OUT/clone" && CI=true bash .ci/run) >"$OUT/run-$n.log" 2>&1 || code=$?
    seconds=$(($(date +%s) - began))
    cleanup
    STRESS=""
    SAMPLER=""
    mean=$(awk '{s += $1} END {if (NR) printf "%.2f", s / NR}' "$loads")
    max=$(sort -n "$loads" | tail -1)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$kind" "$COMMIT" "$start" "$code" "$seconds" "$at_start" "$mean" "$max" >>"$OUT/runs.tsv"
    echo "suite-stability: run $n ($kind) exit $code after ${seconds}s, load mean $mean max $max"
    if [ "$code" -ne 0 ]; then
        echo "suite-stability: run $n failed; its output is $OUT/run-$n.log" >&2
        column -t "$OUT/runs.tsv"
        exit "$code"
    fi
done
column -t "$OUT/runs.tsv"
