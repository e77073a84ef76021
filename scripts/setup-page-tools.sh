#!/usr/bin/env bash
# Installs axe-core (scripts/axe/package-lock.json) into scripts/axe/node_modules: the
# accessibility engine tests/pages.rs runs inside headless Chromium on the probe's status
# page and the monitor page, in light and dark mode. Needs node and npm. Idempotent: skipped
# while its stamp is newer than the lock file.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/scripts/axe"
stamp="$dir/node_modules/.lockprobe-installed"
if ! [[ -f "$stamp" && "$stamp" -nt "$dir/package-lock.json" ]]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup-page-tools: node and npm are required; install them first" >&2
    exit 1
  fi
  echo "setup-page-tools: installing scripts/axe/node_modules" >&2
  (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  touch "$stamp"
fi
(cd "$dir" && node -e 'console.log("axe-core", require("axe-core/package.json").version)')
