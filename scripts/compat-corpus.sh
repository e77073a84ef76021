#!/usr/bin/env bash
# Writes one directory of the compatibility corpus (tests/compat/, see its README.md)
# with the routing library of REVISION: a detached worktree of that revision, sharing
# this checkout's target directory, runs the corpus walk and saves every document
# exactly as that revision stores it, with a manifest of what it decides on each.
#
#   scripts/compat-corpus.sh REVISION API NAME
#
# API is the walk that compiles against REVISION: `contract-1.0` (034c7cc and before),
# `current`, or `force-release` (current's documents plus forceReleases records, bda0220
# and later). NAME is the directory under tests/compat/. A one-off: run it when a
# format or contract version lands, commit what it wrote, never rerun it over a
# directory that is committed (the corpus test refuses edits to committed files).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 3 ]; then
    echo "usage: scripts/compat-corpus.sh REVISION API NAME" >&2
    exit 64
fi
REVISION="$1" API="$2" NAME="$3" ROOT="$PWD"
WALK="scripts/compat-corpus/$API.rs"
[ -f "$WALK" ] || { echo "compat-corpus: API must be contract-1.0, current or force-release, got '$API'" >&2; exit 64; }
case "$NAME" in '' | */* | .*) echo "compat-corpus: NAME must be one directory name, got '$NAME'" >&2; exit 64 ;; esac
OUT="$PWD/tests/compat/$NAME"
if [ -e "$OUT" ] && [ -n "$(git ls-files -- "$OUT")" ]; then
    echo "compat-corpus: $OUT is committed; a format's files are never rewritten" >&2
    exit 64
fi
FULL="$(git rev-parse --verify "$REVISION^{commit}")"

TREE="$PWD/target/compat-corpus/$(git rev-parse --short "$FULL")"
rm -rf "$TREE"
git worktree prune
git worktree add --detach --quiet "$TREE" "$FULL"
trap 'git worktree remove --force "$TREE" 2>/dev/null || true' EXIT
mkdir -p "$TREE/examples"
cp "$WALK" "$TREE/examples/compat_corpus.rs"
rm -rf "$OUT"
(cd "$TREE" && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}" \
    cargo run --quiet --locked --example compat_corpus -- "$OUT" "$(git rev-parse --short=12 "$FULL")")
