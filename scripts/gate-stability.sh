#!/usr/bin/env bash
# The release gate's stability under load (RELIABILITY.md, "Release gate under load").
#
#   scripts/gate-stability.sh [ROUNDS]        # default 20
#
# Each round runs, beside `stress-ng --cpu $LOCKPROBE_STRESS_CPU` (default 6, enough for
# a load average of 4 or more on two cores; the load is checked before every round):
#   - the shipped library through the gate's timing-sensitive profiles (late-ack,
#     slow-commit, ambiguous, clock-ahead, clock-behind): it must pass;
#   - the two legacy builds (`-- --fault legacy-effective-at`, `-- --fault
#     legacy-renewal`) through slow-commit: each must fail, on the check that catches it.
# Every run's JSON reports are kept under target/gate-stability/<start time>/, with a
# `rounds.tsv` (one line a round: load, verdicts, inconclusive operations, attempts) and
# the summary printed at the end. Exit 0 when the shipped library passed every round and
# each legacy build was caught in every round.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${1:-20}"
CPU="${LOCKPROBE_STRESS_CPU:-6}"
MIN_LOAD="${LOCKPROBE_MIN_LOAD:-4}"
case "$ROUNDS" in '' | *[!0-9]* | 0) echo "gate-stability: ROUNDS must be a positive number, got '$ROUNDS'" >&2; exit 64 ;; esac
case "$CPU" in '' | *[!0-9]* | 0) echo "gate-stability: LOCKPROBE_STRESS_CPU must be a positive number, got '$CPU'" >&2; exit 64 ;; esac

if ! command -v stress-ng >/dev/null; then
    echo "gate-stability: installing stress-ng (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q stress-ng >/dev/null
fi
cargo build --locked --quiet
BIN="$PWD/target/debug/lockprobe"
OUT="target/gate-stability/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"

stress-ng --cpu "$CPU" --timeout 24h >/dev/null 2>&1 &
STRESS=$!
trap 'kill "$STRESS" 2>/dev/null || true' EXIT

load() { cut -d' ' -f1 /proc/loadavg; }
# The one-minute load average climbs for about a minute after the load starts.
for _ in $(seq 1 120); do
    awk -v l="$(load)" -v m="$MIN_LOAD" 'BEGIN { exit !(l >= m) }' && break
    sleep 1
done

# Inconclusive operations and attempts over a run's JSON reports: "<inconclusive> <attempts beyond the first>".
tally() {
    python3 - "$1" <<'EOF'
import glob, json, sys
inconclusive = 0
for path in glob.glob(sys.argv[1] + "/*.json"):
    with open(path) as f:
        report = json.load(f)
    inconclusive += sum(d.get("inconclusive", 0) for d in report.get("decisions", []))
print(inconclusive)
EOF
}

printf 'round\tload_before\tload_after\tshipped\tshipped_inconclusive\tshipped_reruns\tlegacy_effective_at\tlegacy_renewal\n' >"$OUT/rounds.tsv"
for round in $(seq 1 "$ROUNDS"); do
    before="$(load)"
    dir="$OUT/round-$round"
    mkdir -p "$dir/shipped" "$dir/lea" "$dir/lr"
    shipped=passed
    "$BIN" gate --profile late-ack --profile slow-commit --profile ambiguous --profile clock-ahead \
        --profile clock-behind --json-dir "$dir/shipped" >"$dir/shipped.txt" 2>&1 || shipped=FAILED
    reruns="$(grep -c 'decided too little' "$dir/shipped.txt" || true)"
    lea=missed
    if ! "$BIN" gate --profile slow-commit --json-dir "$dir/lea" -- --fault legacy-effective-at >"$dir/lea.txt" 2>&1 \
        && grep -q '\[slow-commit\] FAIL \[eager/escalation\] hardDelete/delete @ .*expected tombstone, observed allow' "$dir/lea.txt"; then
        lea=caught
    fi
    lr=missed
    if ! "$BIN" gate --profile slow-commit --json-dir "$dir/lr" -- --fault legacy-renewal >"$dir/lr.txt" 2>&1 \
        && grep -q '\[slow-commit\] FAIL \[eager/renewal\] write/write @ .*expected block, observed allow.*the renewal says renewed (200)' "$dir/lr.txt"; then
        lr=caught
    fi
    after="$(load)"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$before" "$after" "$shipped" "$(tally "$dir/shipped")" \
        "$reruns" "$lea" "$lr" >>"$OUT/rounds.tsv"
    echo "gate-stability: round $round/$ROUNDS load $before -> $after: shipped $shipped, legacy-effective-at $lea, legacy-renewal $lr"
done

python3 - "$OUT/rounds.tsv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
n = len(rows)
loads = [float(r["load_before"]) for r in rows] + [float(r["load_after"]) for r in rows]
failed = sum(r["shipped"] != "passed" for r in rows)
print(f"gate-stability: {n} rounds, load average {min(loads):.2f} to {max(loads):.2f}")
print(f"  shipped library: failed {failed} of {n} rounds "
      f"({sum(int(r['shipped_inconclusive']) for r in rows)} inconclusive operations, "
      f"{sum(int(r['shipped_reruns']) for r in rows)} profile runs repeated for deciding too little)")
print(f"  legacy-effective-at caught {sum(r['legacy_effective_at'] == 'caught' for r in rows)} of {n}")
print(f"  legacy-renewal caught {sum(r['legacy_renewal'] == 'caught' for r in rows)} of {n}")
ok = failed == 0 and all(r["legacy_effective_at"] == "caught" and r["legacy_renewal"] == "caught" for r in rows)
sys.exit(0 if ok else 1)
EOF
