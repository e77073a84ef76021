#!/usr/bin/env bash
# Installs the pinned local Cosmos DB-compatible server the Cosmos store tests start
# (scripts/cosmos/package-lock.json pins @vercel/cosmosdb-server 1.0.1 and its
# dependencies). Idempotent: does nothing when the installed tree matches the lock.
set -euo pipefail
dir="$(cd "$(dirname "$0")/cosmos" && pwd)"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "setup-cosmos: node and npm are required (Node 18 or newer); install them first" >&2
  exit 1
fi

stamp="$dir/node_modules/.lockprobe-installed"
if [[ -f "$stamp" && "$stamp" -nt "$dir/package-lock.json" && -d "$dir/node_modules/@vercel/cosmosdb-server" ]]; then
  exit 0
fi

echo "setup-cosmos: installing @vercel/cosmosdb-server into $dir/node_modules" >&2
(cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
touch "$stamp"
