#!/usr/bin/env bash
# Builds the rollout gate's baseline: this repository's own `lockprobe` at an earlier
# revision (default 034c7cc, the last build that reads document format 1 only), from a
# git worktree, into the suite's own target directory so only the crate itself (and any
# dependency its Cargo.lock pins differently) is compiled again. The binary is copied to
# target/rollout/lockprobe-<revision>; `tests/rollout_gate.rs` runs it beside today's.
#
# Building into the shared target directory replaces target/debug/lockprobe with the old
# build for a moment: the next cargo build of this tree puts today's back (cargo
# re-links a binary it finds up to date), so run this before the suite's builds, never
# beside a running test.
set -euo pipefail
cd "$(dirname "$0")/.."
REVISION=${1:-034c7cc}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
TREE=$TARGET/rollout/src-$REVISION
OUT=$TARGET/rollout/lockprobe-$REVISION
if ! git cat-file -e "$REVISION^{commit}" 2>/dev/null; then
  echo "build-baseline: revision $REVISION is not in this clone (a shallow clone?): fetch the history first" >&2
  exit 1
fi
git worktree prune
if [ ! -d "$TREE" ] || [ "$(git -C "$TREE" rev-parse HEAD 2>/dev/null)" != "$(git rev-parse "$REVISION^{commit}")" ]; then
  rm -rf "$TREE"
  git worktree prune
  git worktree add --detach --force "$TREE" "$REVISION" >/dev/null
fi
(cd "$TREE" && CARGO_TARGET_DIR="$TARGET" cargo build --locked --bin lockprobe)
cp "$TARGET/debug/lockprobe" "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
# Today's binary back in place at once (cheap: nothing to compile if it was built).
cargo build --locked --bin lockprobe
echo "build-baseline: $OUT ($("$OUT" --version))"
