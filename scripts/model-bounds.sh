#!/usr/bin/env bash
# The lock-protocol model at the bounds the suite leaves out for their size
# (docs/model.md, "Wider bounds"): the fixed protocol at the suite's bounds plus a
# release, plus a clock behind as well as ahead, plus a second migration per
# orchestrator, plus a force-release with a delayed message, each run on its own in a
# release build. Each run must find no
# counterexample (every state explored) and reach what shows it is not vacuous.
#
#   scripts/model-bounds.sh [NAME...]     # default: release behind attempts force-release
#                                          # names: release, behind, attempts, force-release,
#                                          # all (the first three at once)
#
# Builds `cargo test --release --test model` and runs its ignored test,
# the_fixed_protocol_has_no_counterexample_at_wider_bounds, with LOCKPROBE_MODEL_BOUNDS
# set to one name at a time; prints each run's states, distinct states, depth, the
# checker's time and the peak memory, and a table of them at the end (the figures
# docs/model.md records). Exit 0 when every run passed; 64 on an unknown name.
set -euo pipefail
cd "$(dirname "$0")/.."

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    names=(release behind attempts force-release)
fi
for name in "${names[@]}"; do
    case "$name" in
        release | behind | attempts | force-release | all) ;;
        *) echo "model-bounds: no bounds named '$name' (the names are release, behind, attempts, force-release, all)" >&2; exit 64 ;;
    esac
done

# Built once; each run is the test binary alone (its time and memory, no cargo around it).
bin="$(cargo test --release --locked --quiet --test model --no-run --message-format=json |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)"
if [ ! -x "$bin" ]; then
    echo "model-bounds: no test binary for tests/model built" >&2
    exit 1
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
status=0
rows=()
for name in "${names[@]}"; do
    echo "model-bounds: $name"
    log="$out/$name.log"
    if LOCKPROBE_MODEL_BOUNDS="$name" /usr/bin/time -f '%M %e' -o "$out/$name.time" \
        "$bin" --ignored --exact the_fixed_protocol_has_no_counterexample_at_wider_bounds --nocapture >"$log" 2>&1; then
        verdict=pass
    else
        verdict=FAIL
        status=1
    fi
    grep -E '^(wider bounds|fixed protocol at|COUNTEREXAMPLE)' "$log" || true
    if [ "$verdict" = FAIL ]; then
        tail -40 "$log"
    fi
    # "fixed protocol at Bounds { .. }: 123 states (45 distinct), depth 30, 8.0s"
    figures="$(grep -E '^fixed protocol at' "$log" | sed -E 's/.*\}: ([0-9]+) states \(([0-9]+) distinct\), depth ([0-9]+), (.*)$/\1 \2 \3 \4/' || true)"
    read -r rss wall <"$out/$name.time" || true
    rows+=("$name $verdict ${figures:-- - - -} ${rss:-?} ${wall:-?}")
done

echo
echo "| bounds | result | states | distinct | depth | checker time | peak RSS (KiB) | wall (s) |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
    read -r name verdict states distinct depth time rss wall <<<"$row"
    echo "| $name | $verdict | $states | $distinct | $depth | $time | $rss | $wall |"
done
exit $status
