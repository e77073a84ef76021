#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need, then runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-cosmos.sh
cargo test --all-targets --locked
